"""``vllm-rl bench points``: the operating-point table, speed-up over stock by batch size.

One :mod:`vllm_rl.bench.step` run (``--gpu-limits``, each configuration on the engine a
user would build for it, every engine scheduling asynchronously) per batch size and
seed, and per configuration the speed-up over stock vLLM (``stock-M``'s time over the
configuration's, same prompts and seeds, in the same run) twice: with the host time
measured here counted as the engine schedules ("host-counted", the headline), and on
the forward passes alone ("GPU-only"), both projected from the step-cost table
(``--cost``).  Over seeds: the mean and a 95% t-interval.

Output in ``--out``: ``points.json`` (every run's summary rows and the aggregate),
``points.png`` (speed-up against live sequences, one line per configuration,
host-counted with its interval, GPU-only dotted) and the table on stdout; each step
run's own JSON and PNGs under ``--out/runs``.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def parser(prog: str = "vllm-rl bench points") -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="16,64,128",
                    help="prompts per step, comma-separated (x M live sequences)")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--m", type=int, default=8)
    from vllm_rl.task.kits import add_argument as add_task_argument

    add_task_argument(ap)
    ap.add_argument("--max-tokens", type=int, default=None,
                    help="the response limit (default 512 on the first kit, 1,024 on the "
                         "reasoning kit)")
    ap.add_argument("--configs", default="darts,duet,das,arrol,das+duet+arrol,all")
    ap.add_argument("--cost", default="h100:qwen3-8b")
    ap.add_argument("--darts-budget", default="adaptive",
                    help="DARTS's total, as `vllm-rl bench step --darts-budget` (the table's "
                         "runs: cost)")
    ap.add_argument("--arrol-gate", default="steering",
                    choices=("steering", "cold", "balance", "auc"),
                    help="ARRoL's gate, as `vllm-rl bench step --arrol-gate` (the table's "
                         "runs: auc)")
    ap.add_argument("--host-scale", type=float, default=1.0)
    from vllm_rl.bench.step.command import history_steps

    ap.add_argument("--history", type=history_steps, default=2,
                    help="earlier steps of the same prompts before each timed one (what DAS's "
                         "trees hold: M rollouts per problem a step; default 2)")
    ap.add_argument("--prompt-seed", type=int, default=None,
                    help="prompts drawn outside the training pool and the fixed held-out set, "
                         "with this seed plus the run's seed (default: the fixed held-out set)")
    ap.add_argument("--host-load", type=int, default=0, metavar="N",
                    help="N processes spinning on the engine's CPUs during every timed step "
                         "(a busy host; as `vllm-rl bench step --host-load`; default 0)")
    ap.add_argument("--das-config", default=None, metavar="JSON",
                    help="more DASConfig fields for the DAS engine, as `vllm-rl bench step "
                         "--das-config` (e.g. '{\"lookahead\": false}')")
    ap.add_argument("--kv-gib-per-seq", type=float, default=None,
                    help="KV cache per live sequence and engine, GiB (default 0.004 per 512 "
                         "tokens of the response limit: room for it on the kits' model)")
    ap.add_argument("--out", default="bench-results/points")
    ap.add_argument("--merge", nargs="+", metavar="POINTS_JSON",
                    help="run nothing: the table and picture of earlier runs' points.json "
                         "files together (same --m)")
    ap.add_argument("--labels", default=None,
                    help="with --merge: one label per file, comma-separated, added to its "
                         "configurations' names (the same configurations run two ways, "
                         "e.g. 'lookahead,wait'; each against its own run's stock)")
    return ap


def _interval(xs: list[float]) -> tuple[float, float, float]:
    """Mean and a 95% t-interval over seeds (one seed: no interval)."""
    from vllm_rl.bench.train.report import t_interval

    return t_interval(xs)


def aggregate(points: list[dict], m: int) -> dict:
    """Per configuration and size: host-counted and GPU-only speed-ups over seeds, in
    complete groups delivered per projected second (a partial step is credited with the
    groups it completes: :func:`vllm_rl.bench.step.report.delivered_speedup`)."""
    from vllm_rl.bench.step.report import delivered_speedup

    out: dict[str, dict] = {}
    for p in points:
        rows = {r["config"]: r for r in p["summary"]}
        base = rows[f"stock-{m}"]
        for name, r in rows.items():
            if name == f"stock-{m}":
                continue
            cell = out.setdefault(name, {}).setdefault(
                str(p["prompts"]), {"host": [], "gpu": [], "proposed": 0, "accepted": 0})
            cell["host"].append(delivered_speedup(base, r, "host_counted_ms"))
            cell["gpu"].append(delivered_speedup(base, r, "projected_ms"))
            cell["proposed"] += r.get("draft_proposed") or 0
            cell["accepted"] += r.get("draft_accepted") or 0
    for name, sizes in out.items():
        for size, cell in sizes.items():
            cell["host_mean"], cell["host_lo"], cell["host_hi"] = _interval(cell["host"])
            cell["gpu_mean"], cell["gpu_lo"], cell["gpu_hi"] = _interval(cell["gpu"])
    return out


def table(agg: dict, sizes: list[int], m: int) -> str:
    head = "| config | " + " | ".join(f"{s}x{m} host-counted | {s}x{m} GPU-only"
                                       for s in sizes) + " |"
    lines = [head, "|---" * (1 + 2 * len(sizes)) + "|"]
    for name, cells in agg.items():
        row = [name]
        for s in sizes:
            c = cells.get(str(s))
            if c is None:
                row += ["", ""]
                continue
            row.append(f"{c['host_mean']:.2f} [{c['host_lo']:.2f}, {c['host_hi']:.2f}]")
            accept = (f" (drafts accepted {c['accepted'] / c['proposed']:.2f})"
                      if c.get("proposed") else "")
            row.append(f"{c['gpu_mean']:.2f}{accept}")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def rests_on(args, sep: str = "; and ") -> str:
    """What the figures rest on: the prompts and the history in DAS's trees (with
    ``--merge`` of runs that rest on different ones, each run's, by its label, joined by
    ``sep``)."""
    merged = getattr(args, "rests", None)
    if merged:
        return sep.join(merged)
    history = getattr(args, "history", 2)
    seed = getattr(args, "prompt_seed", None)
    prompts = ("fixed held-out prompts (the defaults were chosen on them)" if seed is None
               else f"prompts outside its training pool and held-out set (seed {seed} "
               "+ run seed)")
    task = getattr(args, "task", "arith")
    load = getattr(args, "host_load", 0)
    busy = f"; {load} process(es) spinning beside the engine" if load else ""
    return (f"the {task} kit's {prompts}; {history} earlier step(s) of the same prompts "
            f"({history * args.m} rollouts per problem in DAS's trees){busy}")


def _write(out: Path, args, points: list[dict], t0: float) -> dict:
    agg = aggregate(points, args.m)
    out.mkdir(parents=True, exist_ok=True)
    (out / "points.json").write_text(json.dumps(
        {"args": vars(args), "points": points, "aggregate": agg,
         "total_s": time.perf_counter() - t0}, indent=1))
    return agg


def picture(agg: dict, sizes: list[int], args, path: Path) -> Path:
    from vllm_rl.bench import plots

    rests = rests_on(args, sep="\n")
    lines, dashed = {}, {}
    for name, cells in agg.items():
        have = [s for s in sizes if str(s) in cells]
        xs = [s * args.m for s in have]
        c = [cells[str(s)] for s in have]
        lines[name] = (xs, [x["host_mean"] for x in c], [x["host_lo"] for x in c],
                       [x["host_hi"] for x in c])
        dashed[name] = (xs, [x["gpu_mean"] for x in c])
    return plots.speedups(
        lines, path, f"Speed-up over stock vLLM, one rollout step (M = {args.m}, max_tokens "
        f"{args.max_tokens}, projected on {args.cost}, host x {args.host_scale:g})\n"
        f"{rests}\n"
        f"solid: host time counted (mean, 95% CI over seeds); dotted: GPU-only",
        "stock-8 time / configuration time", dashed)


def _labelled(point: dict, label: str, m: int) -> dict:
    """A run's point with its configurations named ``config [label]`` (stock kept: each
    configuration is compared with its own run's stock)."""
    rows = [r if r["config"].startswith("stock") else {**r, "config": f"{r['config']} [{label}]"}
            for r in point["summary"]]
    return {**point, "summary": rows}


def main(argv: list[str] | None = None, prog: str = "vllm-rl bench points") -> dict:
    from vllm_rl.bench.step import command as step

    args = parser(prog).parse_args(argv)
    from vllm_rl.task.kits import kit

    args.max_tokens = args.max_tokens or max(512, kit(args.task).max_tokens)
    args.kv_gib_per_seq = args.kv_gib_per_seq or 0.004 * args.max_tokens / 512
    sizes = [int(s) for s in args.sizes.split(",") if s]
    seeds = [int(s) for s in args.seeds.split(",") if s]
    out = Path(args.out)
    t0 = time.perf_counter()
    points = []
    if args.merge:
        docs = [json.loads(Path(p).read_text()) for p in args.merge]
        for key in ("max_tokens", "cost", "host_scale", "task", "history", "prompt_seed",
                    "host_load", "configs"):             # what the merged runs rest on, not the defaults
            if key in docs[0]["args"]:
                setattr(args, key, docs[0]["args"][key])
        labels = args.labels.split(",") if args.labels else None
        if labels is not None and len(labels) != len(docs):
            raise SystemExit(f"--labels: {len(labels)} label(s) for {len(docs)} file(s)")
        own = [rests_on(argparse.Namespace(**{**vars(args), **d["args"], "rests": None}))
               for d in docs]
        if len(set(own)) > 1:                       # each run's own, by its label
            args.rests = [f"[{labels[i] if labels else i + 1}] {r}" for i, r in enumerate(own)]
        points = [_labelled(pt, labels[i], args.m) if labels else pt
                  for i, d in enumerate(docs) for pt in d["points"]]
        sizes = sorted({pt["prompts"] for pt in points})
        size_seeds = []
    else:
        size_seeds = [(size, seed) for size in sizes for seed in seeds]
    for size, seed in size_seeds:
        print(f"[points] {size} prompts x {args.m}, seed {seed} "
              f"({len(points) + 1}/{len(size_seeds)})", flush=True)
        live = min(size * args.m, 1024)            # max_num_seqs with --gpu-limits
        kv = max(1.0, args.kv_gib_per_seq * live)
        res = step.main(["--gpu-limits", "--task", args.task, "--prompts", str(size),
                         "--m", str(args.m),
                         "--max-tokens", str(args.max_tokens), "--seed", str(seed),
                         "--configs", args.configs, "--cost", args.cost,
                         "--host-scale", str(args.host_scale), "--kv-gib", f"{kv:g}",
                         "--darts-budget", str(args.darts_budget),
                         "--arrol-gate", args.arrol_gate, "--history", str(args.history),
                         *(["--prompt-seed", str(args.prompt_seed + seed)]
                           if args.prompt_seed is not None else []),
                         *(["--das-config", args.das_config] if args.das_config else []),
                         "--host-load", str(args.host_load),
                         "--out", str(out / "runs")])
        points.append({"prompts": size, "seed": seed, "summary": res["summary"],
                       "total_s": res["total_s"]})
        _write(out, args, points, t0)
    agg = _write(out, args, points, t0)
    png = picture(agg, sizes, args, out / "points.png")
    print(f"Rests on {rests_on(args)}. Speed-up: complete groups per projected second over "
          "stock's (a partial step is credited with the groups it completes).")
    print(table(agg, sizes, args.m))
    print(f"\nresults: {out / 'points.json'}\npicture: {png}\n"
          f"total {time.perf_counter() - t0:.0f} s")
    return {"aggregate": agg, "points": points}


__all__ = ["aggregate", "main", "parser", "table"]
