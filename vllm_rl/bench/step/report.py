"""``vllm-rl bench step``'s report: medians over repeats and the speed-ups over stock
(:func:`summarize`), the markdown table (:func:`table`), the header naming what the step
rests on, and the pictures (the length CDF, the running samples over the step)."""
from __future__ import annotations

import statistics
from pathlib import Path

from vllm_rl.bench.matrix import engine_kind
from vllm_rl.bench.step.run import Run


MEDIANS = ("wall_s", "groups", "tokens", "engine_steps", "projected_ms", "host_counted_ms",
           "host_core_ms", "host_worker_ms", "samples", "kept", "kept_mean_reward",
           "kept_mean_length", "draft_proposed", "draft_accepted")
DIAGNOSTICS = ("loss_samples_mean", "zero_adv_groups", "ess_fraction", "eps_weight_share")


def delivered_speedup(base: dict, row: dict, time_key: str) -> float:
    """Complete groups per second over ``base``'s, on ``time_key``'s time.  A full step
    delivers every prompt's group, so for it this is ``base``'s time over the row's; a
    partial step trains only the groups it completes, and is credited with those only.
    Rows from before groups were counted: the time ratio."""
    groups, base_groups = row.get("groups") or 0, base.get("groups") or 0
    ratio = base[time_key] / row[time_key]
    return ratio * groups / base_groups if groups and base_groups else ratio


def summarize(runs: list[Run], base: str) -> list[dict]:
    """Medians over repeats, and speed-ups over ``base`` (its time over the config's)."""
    by: dict[str, list[Run]] = {}
    for r in runs:
        by.setdefault(r.config, []).append(r)
    rows = []
    for name, rs in by.items():
        row = {"config": name, "repeats": len(rs),
               **{k: statistics.median(getattr(r, k) for r in rs) for k in MEDIANS},
               **{k: statistics.median(r.diagnostics.get(k, 0.0) for r in rs)
                  for k in DIAGNOSTICS}}
        reasons: dict[str, int] = {}
        for r in rs:
            for k, v in r.reasons.items():
                reasons[k] = reasons.get(k, 0) + v
        row["reasons"] = {k: v / len(rs) for k, v in reasons.items()}
        row["asynchronous"] = rs[0].asynchronous
        rows.append(row)
    b = next(r for r in rows if r["config"] == base)
    for row in rows:
        for key, time_key in (("cpu_speedup", "wall_s"), ("gpu_speedup", "projected_ms"),
                              ("host_speedup", "host_counted_ms")):
            row[key] = delivered_speedup(b, row, time_key)
    return rows


def header(args, model: str, n_prompts: int, duet: dict, arrol: dict, plans: dict) -> str:
    ns = [p.n for p in plans.values()]
    shortest = sum(p.mode == "shortest" for p in plans.values())
    auc = arrol.get("arrol/heldout_auc", float("nan"))
    drawn = ("the fixed held-out set" if args.prompt_seed is None
             else f"drawn with seed {args.prompt_seed} outside the training pool")
    load = getattr(args, "host_load", 0)
    busy = (f" The timed steps ran beside {load} process(es) spinning on the engine's CPUs."
            if load else "")
    return (f"\n{model}\n{n_prompts} prompts ({drawn}), M = {args.m} kept per prompt, "
            f"max_tokens {args.max_tokens}, temperature 1, one step per configuration "
            f"(median of {args.repeats}), interleaved with stock vLLM, in-process engines"
            f"{' with H100 scheduler limits' if args.gpu_limits else ''}.{busy}\n"
            f"{args.history} previous step(s) of the same prompts ({args.history * args.m} "
            f"rollouts per problem in DAS's trees) gave DARTS M' = {min(ns)}..{max(ns)} "
            f"(mean {statistics.fmean(ns):.1f}"
            f", {shortest} of {len(ns)} prompts saturated: shortest-only), DUET K1/K2 = "
            f"{duet['k1']}/{duet['k2']}, ARRoL's head held-out AUC {auc:.2f} (gate "
            f"{'open' if arrol.get('arrol/gate_open') else 'shut'}).\n"
            f"'GPU ms' is a PROJECTION: the same engine steps priced on the {args.cost} "
            f"step-cost table (not a GPU measurement), forward passes only. '+host ms' adds "
            f"the host time MEASURED on this CPU on each step's critical path (scheduling, "
            f"output processing, drafter, scorer; x {args.host_scale:g}): summed with the "
            f"forward pass where the engine schedules synchronously (sync); where it "
            f"schedules asynchronously (async) the host work overlaps it (max), except a "
            f"drafting DAS step's after it waited for the last step's ids (drafting and "
            f"vLLM's input preparation), which adds. Speed-ups are complete groups "
            f"delivered per second over stock-{args.m}'s: for a full step its time over the "
            f"configuration's; a partial step is credited with the groups it completes.\n")


COLUMNS = (("config", "config", "{}"), ("groups", "groups", "{:.0f}"),
           ("tokens", "tokens", "{:,.0f}"),
           ("engine_steps", "steps", "{:.0f}"), ("kept", "kept", "{:.0f}"),
           ("kept_mean_reward", "kept reward", "{:.3f}"),
           ("kept_mean_length", "kept len", "{:.1f}"),
           ("loss_samples_mean", "loss/grp", "{:.1f}"), ("zero_adv_groups", "0-adv grps", "{:.2f}"),
           ("ess_fraction", "ESS/n", "{:.2f}"), ("wall_s", "CPU s", "{:.1f}"),
           ("cpu_speedup", "CPU x", "{:.2f}"), ("sched", "sched.", "{}"),
           ("host_ms", "host ms", "{:,.0f}"),
           ("projected_ms", "GPU ms (proj.)", "{:,.0f}"),
           ("host_counted_ms", "+host ms (proj.)", "{:,.0f}"),
           ("gpu_speedup", "GPU x (proj.)", "{:.2f}"),
           ("host_speedup", "+host x (proj.)", "{:.2f}"), ("notes", "technique counts", "{}"))


def notes(r: dict) -> str:
    reasons, n = r["reasons"], max(r["samples"], 1)
    out = []
    for key, label in (("darts_cancelled", "cancelled"), ("duet_aborted", "duet aborted"),
                       ("duet_trimmed", "trimmed"), ("arrol_pruned", "pruned")):
        if reasons.get(key):
            out.append(f"{label} {reasons[key] / n:.0%}")
    if r.get("draft_proposed"):
        out.append(f"drafts accepted {r['draft_accepted'] / r['draft_proposed']:.0%}")
    return ", ".join(out)


def table(rows: list[dict], base: str) -> str:
    """A markdown table, one row per configuration."""
    lines = ["| " + " | ".join(h for _, h, _ in COLUMNS) + " |",
             "|" + "---|" * len(COLUMNS)]
    for r in rows:
        host = (r["host_core_ms"] + r["host_worker_ms"]) if "host_core_ms" in r else None
        sched = {True: "async", False: "sync"}.get(r.get("asynchronous"))
        r = {**r, "notes": notes(r), "host_ms": host, "sched": sched}
        lines.append("| " + " | ".join("–" if r.get(k) is None else fmt.format(r[k])
                                       for k, _, fmt in COLUMNS) + " |")
    return "\n".join(lines)


def pictures(runs: list[Run], args, out_dir: Path, stamp: str) -> list[Path]:
    """The length CDF and running samples over the step (first repeat of each config)."""
    from vllm_rl.bench import plots

    first: dict[str, Run] = {}
    for r in runs:
        first.setdefault(r.config, r)
    title = f"{args.prompts} prompts, M = {args.m}, max_tokens {args.max_tokens}"
    cdf = plots.length_cdf({n: r.lengths for n, r in first.items()},
                           out_dir / f"step-{stamp}-lengths.png",
                           f"Generated length per sample, one rollout step ({title})",
                           args.max_tokens)
    by_step = {n: (list(range(len(r.batch_profile))), r.batch_profile)
               for n, r in first.items()}
    run = plots.running(by_step, out_dir / f"step-{stamp}-running.png",
                        f"Samples running in each engine step of one rollout step ({title})",
                        "engine step")
    return [cdf, run, timeline_png(first, args, out_dir / f"step-{stamp}-timeline.png")]


TIMELINE_STEPS = slice(20, 60)     # a stretch in the bulk of the step


def timeline_png(first: dict, args, path: Path) -> Path:
    """Forty engine steps of stock vLLM and of the DAS configurations, laid out in time
    (:func:`vllm_rl.bench.plots.timeline`), and the DAS steps priced as a synchronous
    engine would run them: the overlap async scheduling buys."""
    from vllm_rl.bench import plots

    lanes = {}
    for name, r in first.items():
        if not (name == f"stock-{args.m}" or engine_kind(name) == "das") or not r.timeline:
            continue
        t = r.timeline
        parts = tuple(t.get(k, [0.0] * len(t["gpu_ms"]))[TIMELINE_STEPS]
                      for k in ("gpu_ms", "core_ms", "worker_ms", "path_ms"))
        lanes[f"{name} ({'async' if r.asynchronous else 'sync'}, as run)"] = \
            (*parts, bool(r.asynchronous))
        if name != f"stock-{args.m}" and r.asynchronous:
            lanes[f"{name}, the same steps scheduled synchronously"] = (*parts, False)
    return plots.timeline(lanes, path, f"Engine steps {TIMELINE_STEPS.start}-"
                          f"{TIMELINE_STEPS.stop} of one rollout step ({args.prompts} "
                          f"prompts x {args.m}), host x {args.host_scale:g}")


__all__ = ["header", "pictures", "summarize", "table", "timeline_png"]
