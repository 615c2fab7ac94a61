"""``vllm-rl bench train``: time to accuracy of GRPO through the engine, at equal end-to-end time.

TRL's ``GRPOTrainer`` trains the embedded model with rollouts from an engine in the same
process (:class:`vllm_rl.integrations.trl.rollout.RolloutFunc`, the trainer's weights into the
engine every step), one run per (configuration, seed), every run from the same model:

* ``stock``: stock vLLM (its own scheduler) and plain GRPO, M samples per prompt;
* ``darts``: DARTS Alg. 1 + 2 (per-prompt M'_i in [M, 2M] for App. B's Eq. 8-9 total,
  1.5 MN on the first step: ``DartsPlanner``; dual-end K = M − 1, L = 1, shortest-only
  with early stop where the allocation saturates); ``darts:guard`` adds the project's
  step-cost guard, ``darts:regime`` its regime gate (no extra samples while the lengths
  are outside DARTS's regime, :mod:`vllm_rl.darts.regime_gate`);
* ``duet``: DUET's marker gate with eps-keep (eps = 0.05, G scaled to ``max_tokens`` as
  150 of 3,072, K1/K2 the engine's online natural-length estimate, App. A.3), the group
  baseline over all samples (Alg. A.10 l.38), and its allocator (Thm. 1 / Eq. 4: each
  prompt's n in [2, 2M] for the full budget, Eq. 6's stratification weights);
  ``duet:gate`` is the gate without the allocator (every prompt M), ``duet:eps1`` keeps
  every sample at the gate (the trim alone: an ablation), ``duet:regime`` the engine's
  regime gate (``duet.regime_gate``: no abort while over 6% reach the gate with no
  marker);
* ``das``: DAS drafting from per-problem suffix trees (lossless); ``das:class`` with
  Sec. 4.2.3's length classes;
* ``arrol``: ARRoL pruning at ``l_detect`` with the shared feedback (labels from natural
  ends, head fitted over the buffer, trace features, the cold start, then the gate:
  Eq. 2's steering against random pruning at the same keep rate);
* ``all``: the four together under the composition rule (``docs/ARCHITECTURE.md``), and
  any ``+``-combination (``das+darts``);
* ``partial``: APRIL's partial rollouts across steps (with any configuration:
  ``all+partial``; :class:`~vllm_rl.integrations.common.partial.PartialConfig`'s
  defaults, ``partial:tis`` and ``partial:cap1`` its options): each step launches its
  prompts beside the groups carried from earlier steps, trains on the groups complete
  once half of those launched are, and carries the rest.

**Equal end-to-end time.**  Stock trains ``--steps`` steps; every other configuration
trains until its projected end-to-end time reaches stock's for the same seed (``--budget
time``; at most ``--max-steps``), so a faster configuration gets more steps, as it would
on the named GPUs in the same hours.  A step's end-to-end time is its rollout plus the
trainer's time for it and the weight sync on ``--topology``
(:mod:`vllm_rl.bench.train.budget`, :mod:`vllm_rl.cost.trainer`): colocated, one after
the other, on the headline topology.  ``--budget rollout`` charges the rollout alone (the
trainer free: how the project's earlier runs were made), ``--budget steps`` gives every
configuration ``--steps``.  The learning rate is constant (``--lr-schedule constant``),
so a run's schedule does not depend on how many steps its budget buys.

Each step's rollout is priced on the topology's GPU step-cost table (``--cost`` to name
another): the engine's own steps (batch, query widths, contexts from its step trace)
projected, not the CPU's wall time, with the host time measured here counted
(scheduling, output processing, DAS's drafter, ARRoL's scorer, times ``--host-scale``:
added to the forward pass in a synchronous engine, overlapped with it in stock vLLM's
asynchronous one; :mod:`vllm_rl.cost.host`).  Held-out accuracy: ``--eval-prompts``
never-trained prompts × ``--eval-samples`` samples at the training temperature, every
``--eval-every`` steps, *after* the step's weights are loaded into the engine; the same
seeded samples for every configuration (common random numbers).

The headline is the **speed-up at equal accuracy**, end to end: for accuracy levels up to
stock's mean final accuracy (:func:`~vllm_rl.bench.train.report.levels`), stock's
projected time to the level over the configuration's, per seed (same seed: same prompts,
same held-out samples), their geometric mean with a 95% Student-t interval on the log
scale over the seeds where both reach it (:func:`~vllm_rl.bench.train.report.speedups`),
with the rollout-only axes beside it, and at stock's final mean on every axis: each
accounting, the trainer at half and twice its modelled time, the other topologies of
the shape.

Also reported per configuration (:mod:`vllm_rl.bench.train.report`): final held-out
accuracy with a 95% confidence interval over seeds and its difference from stock paired
by seed, the time to stock's final accuracy, total projected times, tokens, the
staleness of partial rollouts (trained samples and tokens older than the step's
weights, the mean token age) and the learning-signal diagnostics (samples in the loss
per group, zero-advantage groups, ESS, 1/eps weight share).  A PNG of held-out accuracy
against cumulative end-to-end time, rollout time and the step, with seed bands.  Runs go
to ``--workers`` processes (one CPU thread each, :mod:`vllm_rl.bench.train.run`); each
finished step is checkpointed, so ``--resume`` goes on from a stopped run's last step
(:mod:`vllm_rl.bench.train.resume`); the JSON keeps every step of every run.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from vllm_rl.bench.logs import provenance
from vllm_rl.bench.matrix import CONFIGS, is_config
from vllm_rl.bench.train.budget import budget_of, reprice, spend_key
from vllm_rl.bench.train.report import (axes_table, parts_table, plot, seeds_table,
                                        speedup_table, summarize, table, topology_table)
from vllm_rl.bench.train.run import _messages, _worker
from vllm_rl.cost.trainer import TOPOLOGIES, TrainerCost, topology
from vllm_rl.task.kits import DEFAULT as DEFAULT_TASK


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="vllm-rl bench train", formatter_class=argparse.RawDescriptionHelpFormatter,
        description=__doc__.split("\n\n", 1)[0] + "\n\n" + __doc__.split("\n\n", 1)[1])
    ap.add_argument("--configs", default="das",
                    help=f"comma-separated, among {', '.join(CONFIGS)} or any '+'-combination "
                         "of the techniques (das+darts), a technique with a project option "
                         "as technique:option (darts:guard, das:class); stock always runs "
                         "(default: das, the default combination)")
    ap.add_argument("--seeds", type=int, default=3, help="seeds per configuration (default 3)")
    ap.add_argument("--steps", type=int, default=40,
                    help="stock's GRPO steps per run (default 40); its projected rollout "
                         "time, host counted, is every configuration's budget")
    ap.add_argument("--budget", default="time", choices=("time", "rollout", "steps"),
                    help="time (default): each configuration trains until its projected "
                         "end-to-end time (rollout host counted, trainer and sync on "
                         "--topology) reaches stock's over --steps (same seed), at most "
                         "--max-steps; rollout: the same on rollout time alone (the trainer "
                         "free); steps: every configuration --steps")
    ap.add_argument("--max-steps", type=int, default=None,
                    help="the cap on a configuration's steps under --budget time "
                         "(default 3 x --steps)")
    ap.add_argument("--prompts", type=int, default=16,
                    help="prompts per step (default 16: 128 samples per step)")
    ap.add_argument("--m", type=int, default=8, help="samples per prompt in the loss, M")
    ap.add_argument("--pool", type=int, default=256,
                    help="training prompts, cycled (default 256: 2.5 epochs in 40 steps "
                         "of 16)")
    from vllm_rl.task.kits import add_argument as add_task_argument

    add_task_argument(ap)
    ap.add_argument("--max-tokens", type=int, default=None,
                    help="generation cap, training and held-out (default: the kit's, 256 on "
                         "the first, about 4x its mean length; 1,024 on the reasoning kit)")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--lr-schedule", default="constant", choices=("constant", "linear"),
                    help="constant (default: the same learning rate at every step, whatever "
                         "a configuration's step count) or linear (TRL's default, to 0 at "
                         "the run's last step: runs of unequal length anneal differently)")
    ap.add_argument("--eval-every", type=int, default=5,
                    help="held-out accuracy every this many steps (default 5)")
    ap.add_argument("--eval-prompts", type=int, default=64)
    ap.add_argument("--eval-samples", type=int, default=8)
    ap.add_argument("--heldout-seed", type=int, default=None,
                    help="draw the held-out prompts from this generator seed instead of the "
                         "project's fixed held-out set (an outside check on unseen prompts)")
    ap.add_argument("--l-detect", type=int, default=None,
                    help="ARRoL's l_detect (default: the kit's, 24 or 64)")
    ap.add_argument("--regime-log", action="store_true",
                    help="each run writes its samples as a regime log (RUN-regime.jsonl in "
                         "runs/, what `vllm-rl advise` reads)")
    ap.add_argument("--arrol-cold", type=int, default=5,
                    help="ARRoL cold-start steps (default 5: Table 7's shortest that works)")
    ap.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    ap.add_argument("--micro-batch", type=int, default=None,
                    help="the trainer's micro-batch in rows, accumulated to one optimizer "
                         "step per rollout step (the same gradient with less memory: 128 x 8 "
                         "on two workers); default the whole step")
    ap.add_argument("--topology", default=next(iter(TOPOLOGIES)), choices=list(TOPOLOGIES),
                    help="where a step runs: the model shape, the GPUs, whether trainer and "
                         "engine share them (vllm_rl.cost.trainer; default the headline's, "
                         f"{next(iter(TOPOLOGIES))})")
    ap.add_argument("--trainer-cost", default=None,
                    help="a JSON of the trainer's passes measured on a GPU (python -m "
                         "vllm_rl.cost.measure_trainer); default the FLOPs model's constants")
    ap.add_argument("--cost", default=None,
                    help="the step-cost table the rollouts are priced on (default the "
                         "topology's: h100:<its shape>)")
    ap.add_argument("--host-scale", type=float, default=1.0,
                    help="multiplies the host times measured here in the host-counted "
                         "projection: 0.5 models a host CPU twice as fast (default 1.0)")
    ap.add_argument("--out", default="bench-results", help="folder for JSON, PNG, vllm.log")
    ap.add_argument("--resume", action="store_true",
                    help="reuse the runs already in --out/runs from the same arguments")
    ap.add_argument("--small", action="store_true",
                    help="the earlier preset: every configuration, 4 prompts x 8, max_tokens "
                         "192, a pool of 96, accuracy every 10 steps (about an hour here)")
    ap.add_argument("--stop-after", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--quick", action="store_true",
                    help="a smoke run: stock and all, 1 seed, 2 steps, 8 held-out prompts "
                         "x 2, one worker (about two minutes)")
    return ap


# ----------------------------------------------------------------------------- main


# the arguments that decide a run's result (a finished run is reused only if they match)
RUN_ARGS = ("steps", "prompts", "m", "pool", "max_tokens", "lr", "lr_schedule", "eval_every",
            "eval_prompts", "eval_samples", "heldout_seed", "l_detect", "arrol_cold", "cost",
            "host_scale", "budget", "max_steps", "topology", "trainer_cost")
# arguments added after runs were recorded, with their defaults: kept in a run's arguments
# only where they differ, so an earlier run made with what is now the default still matches
LATER_ARGS = {"task": DEFAULT_TASK, "micro_batch": None}


BAR_FORMAT = "{desc}: {percentage:3.0f}%|{bar}| {n:.1f}/{total} [{elapsed}<{remaining}{postfix}]"


def settle(args) -> None:
    """The kit's defaults where the command line left them: the response limit and
    ARRoL's l_detect."""
    from vllm_rl.task.kits import DEFAULT, kit

    task = kit(getattr(args, "task", DEFAULT))
    args.max_tokens = args.max_tokens or task.max_tokens
    args.l_detect = args.l_detect or task.l_detect


def _run_args(args) -> dict:
    """The run-deciding arguments, the :data:`LATER_ARGS` only where they differ from
    their defaults (so the runs made before they existed still match)."""
    settle(args)
    later = {k: v for k, default in LATER_ARGS.items()
             if (v := getattr(args, k, default)) != default}
    return {k: getattr(args, k) for k in RUN_ARGS} | later


def _finished(out: Path, name: str, seed: int, args) -> dict | None:
    """A run this folder already holds from the same arguments (``--resume``)."""
    path = out / "runs" / f"{name}-s{seed}.json"
    if not path.exists():
        return None
    run = json.loads(path.read_text())
    return run if run.get("args") == _run_args(args) else None


def check_configs(names: list[str]) -> list[str]:
    """The configurations' names that are not one (:func:`vllm_rl.bench.matrix.parse`)."""
    return [name for name in names if not is_config(name)]


def main(argv: list[str] | None = None) -> None:
    ap = parser()
    args = ap.parse_args(argv)
    if args.small:
        args.configs, args.prompts, args.max_tokens = ",".join(CONFIGS), 4, 192
        args.pool, args.eval_every = 96, 10
    if args.quick:
        args.configs, args.seeds, args.steps, args.eval_every = "stock,all", 1, 2, 1
        args.eval_prompts, args.eval_samples, args.workers, args.prompts = 8, 2, 1, 2
        args.m, args.pool, args.arrol_cold = 4, 8, 1
    args.cost = args.cost or topology(args.topology).cost_spec
    settle(args)
    names = ["stock"] + [c for c in dict.fromkeys(args.configs.split(",")) if c and c != "stock"]
    unknown = check_configs(names)
    if unknown:
        ap.error(f"unknown configuration(s) {unknown}; choose from {list(CONFIGS)}, a "
                 "'+'-combination of the techniques, or technique:option")
    out = Path(args.out)
    (out / "runs").mkdir(parents=True, exist_ok=True)
    jobs = [(n, s) for s in range(args.seeds) for n in names]
    runs = [r for r in (_finished(out, n, s, args) for n, s in jobs) if r] if args.resume else []
    reprice(runs)                     # the axes added since a reused run was recorded
    done = {(r["config"], r["seed"]) for r in runs}
    todo = [j for j in jobs if j not in done]
    workers = max(1, min(args.workers, len(todo)))
    print(f"{len(jobs)} runs ({', '.join(names)} × {args.seeds} seed(s); stock {args.steps} "
          f"steps, the others " + {"time": f"stock's end-to-end time on {args.topology}",
                                   "rollout": "stock's rollout time, host counted",
                                   "steps": f"{args.steps} steps"}[args.budget]
          + f"), {len(runs)} already done, on {workers} worker(s); vLLM's log: "
          f"{out / 'vllm.log'}")
    import multiprocessing as mp

    from tqdm import tqdm

    ctx = mp.get_context("spawn")
    queue, job_queue = ctx.Queue(), ctx.Queue()
    # Stock runs first: each seed's other configurations start once its stock run has
    # set their budget.
    stock_by = {r["seed"]: r for r in runs if r["config"] == "stock"}
    waiting = {s: [n for n, s2 in todo if s2 == s and n != "stock"] for s in range(args.seeds)}

    budgets: dict[tuple[str, int], float | None] = {}

    def release(seed: int) -> None:
        for n in waiting.pop(seed, []):
            budgets[n, seed] = budget_of(stock_by[seed], args)
            job_queue.put((n, seed, budgets[n, seed]))

    for n, s in todo:
        if n == "stock":
            job_queue.put((n, s, None))
    for s in list(waiting):
        if s in stock_by:
            release(s)
    pending = len(todo)
    if not pending:
        workers = 0
    procs = [ctx.Process(target=_worker, args=(job_queue, vars(args), queue))
             for _ in range(workers if todo else 0)]
    for p in procs:
        p.start()
    # Each run is args.steps units: a step of stock (or under --budget steps) is one, a
    # budgeted step its share of the run's rollout-time budget, so the bar reaches its end
    # with the last run however many steps a budget buys.
    bar = tqdm(total=len(todo) * args.steps, unit="u", bar_format=BAR_FORMAT,
               desc="runs (stock's steps, or the budget's share)")
    shown: dict[tuple[str, int], float] = {}

    def advance(name: str, seed: int, units: float) -> None:
        units = min(units, args.steps - shown.get((name, seed), 0.0))
        shown[name, seed] = shown.get((name, seed), 0.0) + units
        bar.update(units)

    errors = []
    t0 = time.perf_counter()
    for kind, name, seed, payload in _messages(queue, procs):
        if kind == "start":
            continue
        if kind == "step":
            budget = budgets.get((name, seed))
            advance(name, seed, 1.0 if not budget
                    else args.steps * payload[spend_key(args)] / budget)
            msg = f"{name}/s{seed} step {payload['step']}"
            if "heldout" in payload:
                msg += f" acc {payload['heldout']:.3f}"
            bar.set_postfix_str(msg)
        elif kind in ("done", "error"):
            pending -= 1
            advance(name, seed, args.steps)
            if kind == "done":
                runs.append(payload)
                payload["args"] = _run_args(args)
                (out / "runs" / f"{name}-s{seed}.json").write_text(json.dumps(payload))
                if name == "stock":
                    stock_by[seed] = payload
                    release(seed)
            else:
                errors.append((name, seed, payload))
                bar.write(f"run {name}/seed {seed} failed:\n{payload}")
                if name == "stock":              # its seed's other runs have no budget
                    dropped = waiting.pop(seed, [])
                    pending -= len(dropped)
                    for n in dropped:
                        advance(n, seed, args.steps)
            if pending == 0:
                for _ in procs:
                    job_queue.put(None)
    for p in procs:
        p.join()
    bar.close()
    summary = summarize(runs)
    doc = {"args": vars(args), "provenance": provenance(), "summary": summary, "runs": runs,
           "wall_s": time.perf_counter() - t0, "errors": [e[:2] for e in errors]}
    (out / "train.json").write_text(json.dumps(doc, indent=1))
    if summary:
        plot(runs, summary, out / "train.png", args)
        print(table(summary))
        print("\nSpeed-up at equal accuracy: stock's projected time to each level over the "
              "configuration's, the geometric mean over seeds (95% t-interval on the log "
              "scale, seeds where both reach it); e2e: end to end on the topology (rollout "
              "host counted, trainer, sync), the rollout-only axes beside it.\n")
        print(speedup_table(summary))
        print(f"\nAt stock's final mean, on every axis ({args.topology}: "
              f"{topology(args.topology).describe}; the trainer "
              f"{TrainerCost.load(args.topology, args.trainer_cost).source}):\n")
        print(axes_table(summary))
        print("\nPer seed, at stock's final mean:\n")
        print(seeds_table(summary))
        print("\nWhere each configuration's end-to-end time goes:\n")
        print(parts_table(runs))
        others = topology_table(runs, args)
        if others:
            print("\nThe same runs priced on the other topologies of the shape (their "
                  "budgets were the headline's):\n")
            print(others)
    print(f"\n{len(runs)} runs in {doc['wall_s'] / 60:.1f} min; JSON {out / 'train.json'}, "
          f"PNG {out / 'train.png'}")
    if errors:
        sys.exit(f"{len(errors)} run(s) failed: {[e[:2] for e in errors]}")


if __name__ == "__main__":
    main()
