"""The report of ``vllm-rl bench train``: the speed-up at equal accuracy per seed and its
interval (:func:`speedups`, at :func:`levels` up to stock's final mean), the summary per
configuration (:func:`summarize`), its tables and its PNG (:func:`plot`)."""
from __future__ import annotations

import math
import statistics
from pathlib import Path

from vllm_rl.bench.train.budget import AXES, AXIS_WORDS, present, price
from vllm_rl.cost.trainer import TOPOLOGIES, TrainerCost, topology
from vllm_rl.integrations.common.partial import AGE_BINS

COLORS = {"stock": "black", "darts": "tab:blue", "duet": "tab:orange", "das": "tab:green",
          "arrol": "tab:red", "all": "tab:purple"}


# Student t, 0.975 quantile, by degrees of freedom (the 95% two-sided interval)
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
        9: 2.262, 10: 2.228, 12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042}


def t975(df: int) -> float:
    return T975.get(df) or T975[max(k for k in T975 if k <= df)] if df < 30 else 1.96


def t_interval(values: list[float]) -> tuple[float, float, float]:
    """Mean and 95% Student-t interval over seeds (half-width 0 with one seed)."""
    m = statistics.fmean(values)
    if len(values) < 2:
        return m, m, m
    half = t975(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return m, m - half, m + half


MAX_GRAD_NORM = 1.0     # TRL's (transformers') default, which every run keeps
LEVELS = 4          # accuracy levels up to stock's final mean


def curve(run: dict, key: str = "h100_s") -> list[tuple[int, float, float]]:
    """(step, cumulative projected seconds on axis ``key``, held-out accuracy), step 0
    first."""
    out, total = [(0, 0.0, run["heldout_start"])], 0.0
    for row in run["steps"]:
        total += row[key]
        if "heldout" in row:
            out.append((row["step"], total, row["heldout"]))
    return out


def mean_curve(curves: list[list[tuple[int, float, float]]]) -> list[tuple[float, float]]:
    """The seed-mean (time, accuracy) curve over the evaluation points all runs have."""
    n = min(len(c) for c in curves)
    return [(statistics.fmean(c[k][1] for c in curves), statistics.fmean(c[k][2] for c in curves))
            for k in range(n)]


def levels(by: dict[str, list[dict]], stock_mean: float | None) -> list[float]:
    """The accuracy levels of the equal-accuracy speed-up: :data:`LEVELS` evenly spaced
    from above the highest seed-mean start up to stock's final mean, the last (every level
    stock's seed-mean curve reaches; a configuration that does not reach one says so)."""
    starts = [mean_curve([curve(r) for r in rs])[0][1] for rs in by.values()]
    if stock_mean is None:
        return []
    lo = max(starts)
    if stock_mean <= lo:
        return [stock_mean]
    return [lo + (stock_mean - lo) * (k + 1) / LEVELS for k in range(LEVELS)]


def speedups(stock: list[dict], runs: list[dict], level: float, key: str) -> dict:
    """Stock's projected time to ``level`` over the configuration's, on axis ``key``: per
    seed (same seed: same held-out samples, same prompts), their geometric mean with a
    95% t-interval on the log scale over the seeds where both reach it (a ratio's
    interval: positive, and 2× and 0.5× equally far from 1), and of the seed-mean
    curves."""
    stock_by = {r["seed"]: r for r in stock}
    per_seed = {}
    for r in runs:
        if r["seed"] not in stock_by:
            continue
        t_s = time_to([(t, a) for _, t, a in curve(stock_by[r["seed"]], key)], level)
        t_c = time_to([(t, a) for _, t, a in curve(r, key)], level)
        if t_s and t_c:
            per_seed[r["seed"]] = t_s / t_c
    t_s = time_to(mean_curve([curve(r, key) for r in stock]), level)
    t_c = time_to(mean_curve([curve(r, key) for r in runs]), level)
    out = {"level": level, "per_seed": per_seed, "seeds_reached": len(per_seed),
           "of_means": t_s / t_c if t_s and t_c else None}
    if per_seed:
        m, lo, hi = t_interval([math.log(v) for v in per_seed.values()])
        out["mean"], out["lo"], out["hi"] = math.exp(m), math.exp(lo), math.exp(hi)
    return out


def time_to(points: list[tuple[float, float]], target: float) -> float | None:
    """The first time a piecewise-linear (time, accuracy) curve reaches ``target``."""
    for (t0, a0), (t1, a1) in zip(points, points[1:]):
        if a0 >= target:
            return t0
        if a1 >= target:
            return t0 + (t1 - t0) * (target - a0) / (a1 - a0)
    return points[-1][0] if points and points[-1][1] >= target else None


def summarize(runs: list[dict]) -> dict:
    by: dict[str, list[dict]] = {}
    for r in runs:
        by.setdefault(r["config"], []).append(r)
    out: dict = {}
    stock_final, stock_by_seed = None, {}
    if "stock" in by:
        stock_by_seed = {r["seed"]: curve(r)[-1][2] for r in by["stock"]}
        stock_final = t_interval(list(stock_by_seed.values()))
    axes = present(runs)          # the time axes every step has (older runs: fewer)
    for name in sorted(by, key=lambda c: (c != "stock", list(by).index(c))):
        rs = by[name]
        curves = [curve(r) for r in rs]
        final = t_interval([c[-1][2] for c in curves])
        mean_pts = mean_curve(curves)
        total = statistics.fmean(sum(s["h100_s"] for s in r["steps"]) for r in rs)
        host_total = None                  # runs written before host times were traced: none
        if all("h100_host_s" in s for r in rs for s in r["steps"]):
            host_total = statistics.fmean(sum(s["h100_host_s"] for s in r["steps"]) for r in rs)
        diag = {}
        for key in ("diag_loss_samples_mean", "diag_zero_adv_groups", "diag_ess_fraction",
                    "diag_eps_weight_share", "diag_stale_sample_share",
                    "diag_stale_token_share", "diag_token_age_mean",
                    *(f"diag_token_age_share_{b}" for b in AGE_BINS)):
            vals = [s[key] for r in rs for s in r["steps"] if key in s]
            if vals:
                diag[key[5:]] = statistics.fmean(vals)
        norms = [s["grad_norm"] for r in rs for s in r["steps"] if "grad_norm" in s]
        if norms:                  # TRL clips the gradient's norm at max_grad_norm = 1.0
            diag["grad_norm"] = statistics.median(norms)
            diag["clipped"] = sum(v > MAX_GRAD_NORM for v in norms) / len(norms)
        row = {"seeds": len(rs), "steps": statistics.fmean(len(r["steps"]) for r in rs),
               "final": final[0], "final_lo": final[1], "final_hi": final[2],
               "start": statistics.fmean(r["heldout_start"] for r in rs),
               "h100_total_s": total, "h100_host_total_s": host_total,
               "tokens": statistics.fmean(sum(s["tokens"] for s in r["steps"]) for r in rs),
               "engine_steps": statistics.fmean(sum(s["engine_steps"] for s in r["steps"])
                                                for r in rs),
               "train_reward_last5": statistics.fmean(
                   statistics.fmean(s["train_reward"] for s in r["steps"][-5:]) for r in rs),
               "length_last5": statistics.fmean(
                   statistics.fmean(s["length"] for s in r["steps"][-5:]) for r in rs),
               "curve": mean_pts, **diag}
        if stock_final is not None:
            pairs = [c[-1][2] - stock_by_seed[r["seed"]] for r, c in zip(rs, curves)
                     if r["seed"] in stock_by_seed]
            if pairs:                                 # same seed, same held-out samples
                row["delta"], row["delta_lo"], row["delta_hi"] = t_interval(pairs)
            row["target"] = stock_final[1]            # the lower end of stock's final CI
            row["time_to_target_s"] = time_to(mean_pts, stock_final[1])
            row["target_mean"] = stock_final[0]       # stock's mean final accuracy
            row["time_to_mean_s"] = time_to(mean_pts, stock_final[0])
            if all("h100_host_s" in st for r in rs for st in r["steps"]):
                row["time_to_mean_host_s"] = time_to(
                    mean_curve([curve(r, AXES["rollout"]) for r in rs]), stock_final[0])
        row["total_s"] = {label: statistics.fmean(sum(s[key] for s in r["steps"]) for r in rs)
                          for label, key in axes.items()}
        out[name] = row
    if "stock" in by:                 # the headline: speed-up at equal accuracy, per seed
        targets = levels(by, stock_final[0] if stock_final else None)
        for name, row in out.items():
            row["levels"] = targets
            row["speedup"] = {axis: [speedups(by["stock"], by[name], lv, key)
                                     for lv in targets]
                              for axis, key in axes.items()}
    if "stock" in out:
        base = out["stock"]["h100_total_s"]
        for row in out.values():
            row["h100_vs_stock"] = base / row["h100_total_s"] if row["h100_total_s"] else None
            host_base, host = out["stock"].get("h100_host_total_s"), row.get("h100_host_total_s")
            row["h100_host_vs_stock"] = host_base / host if host_base and host else None
            for key in ("target", "mean"):
                t = row.get(f"time_to_{key}_s")
                row[f"time_to_{key}_frac"] = t / base if t is not None and base else None
            t = row.get("time_to_mean_host_s")
            row["time_to_mean_host_frac"] = (t / host_base if t is not None and host_base
                                             else None)
    return out


def _speedup(cell: dict | None) -> str:
    if cell is None or "mean" not in cell:
        return "not reached"
    return (f"{cell['mean']:.2f}× ({cell['lo']:.2f}–{cell['hi']:.2f}, "
            f"{cell['seeds_reached']} seeds)")


def speedup_table(summary: dict) -> str:
    """Speed-up at equal accuracy: per level, on the first axis the runs have (end to end
    where the trainer is charged), end to end with the host hidden and the rollout-only
    axes beside it."""
    first = next(iter(summary.values()), {})
    targets = first.get("levels") or []
    if not targets:
        return ""
    sp0 = first.get("speedup", {})
    main = next((a for a in ("e2e", "rollout", "gpu") if a in sp0), None)
    beside = [a for a in ("e2e host hidden", "rollout", "gpu") if a in sp0 and a != main]
    last = len(targets) - 1
    head = ["config"] + [f"acc {lv:.3f}" + (" (stock's final mean)" if k == last else "")
                         for k, lv in enumerate(targets)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, r in summary.items():
        if name == "stock":
            continue
        sp = r.get("speedup", {})
        cells = []
        for k in range(len(targets)):
            cell = f"{main} {_speedup(sp[main][k])}" if main else "–"
            cell += "".join(f"; {a} {_speedup(sp[a][k])}" for a in beside)
            cells.append(cell)
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def axes_table(summary: dict) -> str:
    """At stock's final mean: the speed-up at equal accuracy on every axis (the
    accountings and the trainer-cost sensitivity beside the headline)."""
    first = next(iter(summary.values()), {})
    labels = [a for a in AXES if a in first.get("speedup", {})]
    if not first.get("levels") or not labels:
        return ""
    lines = ["| config | " + " | ".join(AXIS_WORDS[a] for a in labels) + " |",
             "|" + "---|" * (len(labels) + 1)]
    for name, r in summary.items():
        if name != "stock":
            lines.append(f"| {name} | " + " | ".join(_speedup(r["speedup"][a][-1])
                                                      for a in labels) + " |")
    return "\n".join(lines)


def seeds_table(summary: dict) -> str:
    """Per seed, the speed-up at stock's final mean on each axis the runs have."""
    first = next(iter(summary.values()), {})
    labels = [a for a in ("e2e", "rollout") if a in first.get("speedup", {})]
    if not first.get("levels") or not labels:
        return ""
    lines = ["| config | axis | per seed (seed: ×) | geometric mean (95% t on logs) |",
             "|---|---|---|---|"]
    for name, r in summary.items():
        if name == "stock":
            continue
        for a in labels:
            cell = r["speedup"][a][-1]
            seeds = ", ".join(f"{s}: {v:.2f}×" for s, v in sorted(cell["per_seed"].items()))
            lines.append(f"| {name} | {a} | {seeds or 'not reached'} | {_speedup(cell)} |")
    return "\n".join(lines)


def topology_table(runs: list[dict], args) -> str:
    """The speed-up at equal accuracy at stock's final mean, end to end, with the same runs
    priced on each other topology of the headline's shape (each step's trained batch
    kept: the trainer is priced again, the rollout as it was)."""
    import copy

    shape = topology(args.topology).shape
    names = [t for t, topo in TOPOLOGIES.items() if topo.shape == shape and t != args.topology]
    if not names or not all("trained" in st for r in runs for st in r["steps"]):
        return ""
    cols = {}
    for t in names:
        priced = copy.deepcopy(runs)
        price(priced, TrainerCost.load(t, args.trainer_cost))
        cols[t] = summarize(priced)
    configs = [c for c in next(iter(cols.values())) if c != "stock"]
    lines = ["| config | " + " | ".join(f"{t} ({TOPOLOGIES[t].accounting})" for t in names)
             + " |", "|" + "---|" * (len(names) + 1)]
    for c in configs:
        lines.append(f"| {c} | " + " | ".join(
            _speedup(cols[t][c]["speedup"]["e2e"][-1]) if cols[t][c].get("speedup") else "–"
            for t in names) + " |")
    return "\n".join(lines)


#: Where a step's end-to-end time goes (:func:`parts_table`): label, the part's seconds.
PARTS = (("rollout, forward passes", lambda s: s["h100_s"]),
         ("rollout, host beyond them", lambda s: s["h100_host_s"] - s["h100_s"]),
         ("trainer: log-prob, forward and backward, optimizer",
          lambda s: s["trainer"]["trainer_s"]),
         ("weight sync", lambda s: s["trainer"]["sync_s"]),
         ("end to end", lambda s: s["e2e_s"]))


def parts_table(runs: list[dict]) -> str:
    """Where each configuration's end-to-end time goes: each part's mean seconds per
    step over its runs' steps (``PARTS``; the host part is host counted minus the forward
    passes, what the engine's host work adds as it schedules), the steps per run, and
    the garbage collector's share of the engine core's host time and the lowest run's
    share of a CPU (:func:`_cpu_share`) where they were recorded.
    The last line is the ceiling the trainer sets: stock's step over its trainer and
    sync, the speed-up a rollout that took no time would give."""
    by: dict[str, list[dict]] = {}
    for r in runs:
        by.setdefault(r["config"], []).append(r)
    if "stock" not in by or not all("trainer" in s and "e2e_s" in s
                                    for r in runs for s in r["steps"]):
        return ""
    order = sorted(by, key=lambda c: (c != "stock", list(by).index(c)))
    head = ["per step, mean s"] + order
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, part in PARTS:
        cells = [statistics.fmean(part(s) for r in by[c] for s in r["steps"]) for c in order]
        lines.append(f"| {label} | " + " | ".join(f"{v:.2f}" for v in cells) + " |")
    lines.append("| steps per run | " + " | ".join(
        f"{statistics.fmean(len(r['steps']) for r in by[c]):.1f}" for c in order) + " |")
    gc_cells = []
    for c in order:
        steps = [s for r in by[c] for s in r["steps"]]
        core = sum(s.get("host_core_s", 0.0) for s in steps)
        gc_cells.append(f"{sum(s['host_gc_s'] for s in steps) / core:.1%}"
                        if core and all("host_gc_s" in s for s in steps) else "–")
    lines.append("| garbage collection, share of the core's host time | "
                 + " | ".join(gc_cells) + " |")
    lines.append("| the run's share of a CPU, lowest run (host times inflate below 1) | "
                 + " | ".join(_cpu_share(by[c]) for c in order) + " |")
    stock = [s for r in by["stock"] for s in r["steps"]]
    ceiling = (statistics.fmean(s["e2e_s"] for s in stock)
               / statistics.fmean(s["trainer"]["trainer_s"] + s["trainer"]["sync_s"]
                                  for s in stock))
    return "\n".join(lines) + (f"\n\nA rollout that took no time would make stock's step "
                               f"{ceiling:.2f}× faster end to end.")


def _cpu_share(runs: list[dict]) -> str:
    """The lowest of the runs' CPU shares (each run's CPU time over its wall time across
    its steps), or – where a run did not record it."""
    shares = []
    for r in runs:
        steps = r["steps"]
        if not steps or not all("cpu_share" in s for s in steps):
            return "–"
        shares.append(statistics.fmean(s["cpu_share"] for s in steps))
    return f"{min(shares):.2f}"


def _opt(r: dict, key: str, fmt: str) -> str:
    return "–" if r.get(key) is None else format(r[key], fmt)


def _time_to(r: dict, key: str) -> str:
    t = r.get(f"time_to_{key}_s")
    return "not reached" if t is None else f"{t:.1f} ({r[f'time_to_{key}_frac']:.2f})"


def _delta(r: dict) -> str:
    if "delta" not in r:
        return "–"
    return f"{r['delta']:+.3f} ({r['delta_lo']:+.3f} to {r['delta_hi']:+.3f})"


def _host_total(r: dict) -> str:
    t = r.get("h100_host_total_s")
    return "–" if t is None else f"{t:.1f} ({r.get('h100_host_vs_stock') or 0:.2f}×)"


def _e2e_total(summary: dict, r: dict) -> str:
    t, base = r.get("total_s", {}).get("e2e"), summary.get("stock", {}).get("total_s", {})
    if t is None:
        return "–"
    return f"{t:.1f}" + (f" ({base['e2e'] / t:.2f}×)" if base.get("e2e") and t else "")


def _stale(r: dict) -> str:
    if r.get("stale_sample_share") is None:
        return "–"
    return (f"{r['stale_sample_share']:.0%} / {r['stale_token_share']:.0%} "
            f"({r['token_age_mean']:.2f})")


def table(summary: dict) -> str:
    head = ("config", "seeds", "steps", "held-out start", "final (95% CI)", "vs stock, paired (95% CI)",
            "time to stock's final CI low, proj. s (× stock total)",
            "time to stock's final mean, proj. s (× stock total)", "total proj. s (× stock)",
            "total proj. + host s (× stock)", "total end to end s (× stock)",
            "stale samples / tokens (token age mean)", "tokens", "train reward (last 5)", "loss samples / group", "zero-adv groups",
            "ESS / n", "1/ε share", "grad norm (median)", "steps clipped")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, r in summary.items():
        tts, ttm = (_time_to(r, key) for key in ("target", "mean"))
        lines.append(
            f"| {name} | {r['seeds']} | {r.get('steps', 0):.1f} | {r['start']:.3f} | "
            f"{r['final']:.3f} "
            f"({r['final_lo']:.3f}–{r['final_hi']:.3f}) | {_delta(r)} | {tts} | {ttm} | "
            f"{r['h100_total_s']:.1f} "
            f"({r.get('h100_vs_stock') or 0:.2f}×) | {_host_total(r)} | "
            f"{_e2e_total(summary, r)} | {_stale(r)} | {r['tokens']:,.0f} | "
            f"{r['train_reward_last5']:.3f} | {r.get('loss_samples_mean', 0):.1f} | "
            f"{r.get('zero_adv_groups', 0):.2f} | {r.get('ess_fraction', 0):.2f} | "
            f"{r.get('eps_weight_share', 0):.3f} | {_opt(r, 'grad_norm', '.2f')} | "
            f"{_opt(r, 'clipped', '.0%')} |")
    return "\n".join(lines)


def color_of(names: list[str]) -> dict[str, str]:
    """Each configuration's colour: :data:`COLORS`' for the named ones, the others from
    the tab palette's colours no named one uses, so no two lines share one."""
    spare = [c for c in ("tab:brown", "tab:pink", "tab:olive", "tab:cyan", "tab:gray",
                         "tab:red", "tab:purple", "tab:blue", "tab:orange", "tab:green")
             if c not in {COLORS[n] for n in names if n in COLORS}]
    out = {}
    for name in names:
        out[name] = COLORS.get(name) or (spare.pop(0) if spare else "tab:gray")
    return out


def plot(runs: list[dict], summary: dict, path: Path, args) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    axes = present(runs)
    labels = [a for a in ("e2e", "rollout", "gpu") if a in axes][:2] + [None]
    keys = [axes[a] if a else None for a in labels]
    fig, plots = plt.subplots(1, len(keys), figsize=(7 * len(keys), 5.5))
    colors = color_of(list(summary))
    for name in summary:
        rs = [r for r in runs if r["config"] == name]
        style = dict(color=colors[name], lw=2.4 if name in ("stock", "all") else 1.4,
                     ls="--" if name == "stock" else "-")
        for a, key in zip(plots, keys):
            curves = [curve(r, key or AXES["gpu"]) for r in rs]
            n = min(len(c) for c in curves)
            x = ([curves[0][k][0] for k in range(n)] if key is None
                 else [statistics.fmean(c[k][1] for c in curves) for k in range(n)])
            acc = [[c[k][2] for c in curves] for k in range(n)]
            a.plot(x, [statistics.fmean(v) for v in acc], marker="o", ms=4, label=name,
                   **style)
            a.fill_between(x, [min(v) for v in acc], [max(v) for v in acc],
                           color=colors[name], alpha=0.12)
    if "stock" in summary:
        s = summary["stock"]
        for a in plots:
            a.axhspan(s["final_lo"], s["final_hi"], color="grey", alpha=0.15,
                      label="stock final, 95% CI")
    for a, label in zip(plots, labels):
        a.set_xlabel("GRPO step" if label is None else
                     f"cumulative time, {AXIS_WORDS[label]}, projected (s)")
    ax = plots[0]
    for a in plots:
        a.set_ylabel(f"held-out accuracy ({args.eval_prompts} prompts × "
                     f"{args.eval_samples}, T = 1)")
        a.grid(alpha=0.3)
    ax.legend(fontsize=9, loc="lower right")
    seeds = max(s["seeds"] for s in summary.values())
    fig.suptitle(f"Time to accuracy: GRPO (TRL) on the embedded model through the engine, "
                 f"priced on {args.topology} (rollout table {args.cost}); mean of {seeds} "
                 "seed(s), band = min–max over seeds", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
