"""``vllm-rl bench train``: time to accuracy of GRPO through the engine, at equal rollout time.

TRL's ``GRPOTrainer`` trains the embedded model with rollouts from an engine in the same
process (:class:`vllm_rl.integrations.trl.rollout.RolloutFunc`, the trainer's weights into the
engine every step), one run per (configuration, seed), every run from the same model:

* ``stock``: stock vLLM (its own scheduler) and plain GRPO, M samples per prompt;
* ``darts``: DARTS Alg. 1 + 2 (per-prompt M'_i in [M, 2M] for App. B's Eq. 8-9 total,
  1.5 MN on the first step: ``DartsPlanner``; dual-end K = M − 1, L = 1, shortest-only
  with early stop where the allocation saturates); ``darts:guard`` adds the project's
  step-cost guard;
* ``duet``: DUET's marker gate with eps-keep (eps = 0.05, G scaled to ``max_tokens`` as
  150 of 3,072, K1/K2 the engine's online natural-length estimate, App. A.3), the group
  baseline over all samples (Alg. A.10 l.38), and its allocator (Thm. 1 / Eq. 4: each
  prompt's n in [2, 2M] for the full budget, Eq. 6's stratification weights);
  ``duet:gate`` is the gate without the allocator (every prompt M), ``duet:eps1`` keeps
  every sample at the gate (the trim alone: an ablation);
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

**Equal rollout time.**  Stock trains ``--steps`` steps; every other configuration
trains until its projected rollout time, host counted, reaches stock's for the same seed
(``--budget time``; at most ``--max-steps``), so a faster configuration gets more steps,
as it would on a GPU in the same hours.  The learning rate is constant (``--lr-schedule
constant``), so a run's schedule does not depend on how many steps its budget buys.

Each step's rollout is priced on a measured GPU step-cost table (``--cost``, default the
H100 table for Qwen3-8B shapes): the engine's own steps (batch, query widths, contexts
from its step trace) projected, not the CPU's wall time.  Beside it, the same steps with
the host time measured here counted (scheduling, output processing, DAS's drafter,
ARRoL's scorer, times ``--host-scale``: added to the forward pass in a synchronous
engine, overlapped with it in stock vLLM's asynchronous one; :mod:`vllm_rl.cost.host`).  Held-out accuracy: ``--eval-
prompts`` never-trained prompts × ``--eval-samples`` samples at the training temperature,
every ``--eval-every`` steps, *after* the step's weights are loaded into the engine; the
same seeded samples for every configuration (common random numbers).

The headline is the **speed-up at equal accuracy**: for accuracy levels that every
configuration's seed-mean curve reaches (:func:`levels`: four evenly spaced up to the
lowest peak, and stock's mean final accuracy), stock's projected rollout time to the
level over the configuration's, per seed (same seed: same prompts, same held-out
samples) with a 95% Student-t interval over the seeds where both reach it
(:func:`speedups`), on the host-counted axis with the GPU-only one beside it.

Also reported per configuration: final held-out accuracy with a 95% confidence interval
over seeds (Student t) and its difference from stock paired by seed (same held-out
samples), the projected rollout time to reach stock's final accuracy (where the
seed-mean curve first reaches the lower end of stock's final interval, and stock's mean
final accuracy, interpolated on cumulative projected time), total projected rollout time,
tokens, and the learning-signal diagnostics (samples in the loss per group, zero-advantage
groups, ESS, 1/eps weight share).  A PNG of held-out accuracy against cumulative projected
rollout time, host-counted and GPU-only, and against the step, with seed bands.  Runs go
to ``--workers`` processes (one CPU thread each); the JSON keeps every step of every
run.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

from vllm_rl.bench import train_resume
from vllm_rl.bench.logs import provenance
from vllm_rl.bench.matrix import CONFIGS, is_config, parse, technique_flags
from vllm_rl.bench.train_axes import AXES, AXIS_WORDS, present, price, price_step
from vllm_rl.cost.trainer import TOPOLOGIES, TrainerCost, topology

COLORS = {"stock": "black", "darts": "tab:blue", "duet": "tab:orange", "das": "tab:green",
          "arrol": "tab:red", "all": "tab:purple"}


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
    ap.add_argument("--max-tokens", type=int, default=256,
                    help="generation cap, training and held-out (default 256, about 4x the "
                         "mean length)")
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
    ap.add_argument("--l-detect", type=int, default=24, help="ARRoL's l_detect (default 24)")
    ap.add_argument("--arrol-cold", type=int, default=5,
                    help="ARRoL cold-start steps (default 5: Table 7's shortest that works)")
    ap.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
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


# ----------------------------------------------------------------------------- a worker


def _engines(cache: dict) -> dict:
    """The worker's two in-process engines, made once: stock vLLM (its own scheduler,
    traced) and the RL engine (DAS drafter, ARRoL head, traced)."""
    if not cache:
        from vllm_rl.bench.engines import rl_engine, stock_engine
        from vllm_rl.task import MODEL_PATH

        cache["stock"] = stock_engine(str(MODEL_PATH), max_model_len=512)
        cache["rl"] = rl_engine(str(MODEL_PATH), max_model_len=512)
    return cache


def _reset(llm, hidden_size: int) -> None:
    """A run starts from a clean RL engine: no trees, an untrained head scoring only,
    DUET's online thresholds from their cold start."""
    from vllm_rl.arrol.head import QualityHead
    from vllm_rl.engine.trace import engine_scheduler

    llm.das_clear()
    llm.arrol_update(head=QualityHead(hidden_size).export(0), cold_start=True, version=0)
    engine_scheduler(llm).duet_thresholds.clear()


def _heldout(args) -> list[str]:
    from vllm_rl.task import heldout_prompts, train_problems
    from vllm_rl.task.problems import _problem_set

    if args.heldout_seed is None:
        return heldout_prompts(args.eval_prompts)
    exclude = set(train_problems(args.pool)) | set(_problem_set(1234, 256))
    return [p.prompt for p in _problem_set(args.heldout_seed, args.eval_prompts, exclude)]


def _accuracy(llm, held: list[str], args) -> float:
    """Held-out accuracy at T = 1: the same seeded samples for every configuration."""
    import vllm

    from vllm_rl.task import reward

    params = [vllm.SamplingParams(n=args.eval_samples, temperature=1.0,
                                  max_tokens=args.max_tokens, seed=90_000 + i)
              for i in range(len(held))]
    outs = llm.generate(held, params, use_tqdm=False)
    return statistics.fmean(reward(p, c.text) for p, o in zip(held, outs) for c in o.outputs)


def run_one(name: str, seed: int, args, engines: dict, progress=None,
            start_cache: dict | None = None, budget_s: float | None = None) -> dict:
    """One GRPO run of ``name`` with ``seed``: per-step figures and the eval curve.
    ``budget_s``: train until the projected time on the budget's axis (:func:`spend_key`)
    reaches it (at most ``max_steps``), the last step evaluated; None: ``args.steps``
    steps.  Each finished step is checkpointed (:mod:`vllm_rl.bench.train_resume`); with
    ``args.resume`` a stopped run goes on from its last one."""
    import random

    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOConfig

    from vllm_rl.cost import load_cost
    from vllm_rl.engine.trace import engine_trace
    from vllm_rl.arrol.controller import ArrolFeedback
    from vllm_rl.bench.matrix import partial_setting
    from vllm_rl.integrations.trl.rollout import RolloutFunc, masked_reward
    from vllm_rl.integrations.trl.trainer import RLGRPOTrainer
    from vllm_rl.outcome import Reason
    from vllm_rl.task import MODEL_PATH, reward, train_prompts
    from vllm_rl.weights import load_weights

    flags = technique_flags(name, args.max_tokens, args.l_detect)
    llm = engines["stock" if flags is None else "rl"]
    model = AutoModelForCausalLM.from_pretrained(MODEL_PATH)
    hidden_size = model.config.hidden_size
    load_weights(llm, model.state_dict())
    if flags is not None:
        _reset(llm, hidden_size)
    feedback = None
    if flags and "arrol" in flags:
        feedback = ArrolFeedback(flags["arrol"], cold_start_steps=args.arrol_cold,
                                 hidden_size=hidden_size, seed=seed)
    options = parse(name)[1]
    planner = None
    if flags and "darts" in flags:
        from vllm_rl.darts.controller import DartsPlanner

        planner = DartsPlanner(args.m, max_tokens=args.max_tokens,
                               guard="guard" in options.get("darts", ()))
    gate_only = "gate" in options.get("duet", ())
    rollout = RolloutFunc(llm, flags, max_tokens=args.max_tokens, seed=seed,
                          problem_id=lambda p: p, arrol_feedback=feedback, planner=planner,
                          reward=reward if feedback is not None else None,
                          duet_allocation=None if gate_only else "auto",
                          partial=partial_setting(name))
    max_steps = args.steps if budget_s is None else (args.max_steps or 3 * args.steps)
    cost = load_cost(args.cost)
    trainer_cost = TrainerCost.load(args.topology, args.trainer_cost)
    spend = spend_key(args)
    run_dir = train_resume.folder(args.out, name, seed)
    checkpoint = train_resume.latest(run_dir) if args.resume else None
    if checkpoint is None:
        train_resume.clear(run_dir)
    trace = engine_trace(llm)
    held = _heldout(args)
    pool = train_prompts(args.pool)
    order = []
    rng = random.Random(seed)
    while len(order) < max_steps * args.prompts:
        epoch = list(pool)
        rng.shuffle(epoch)
        order += epoch
    dataset = Dataset.from_dict({"prompt": order[:max_steps * args.prompts]})
    steps: list[dict] = []
    state = {"mark": trace.mark(), "spent": 0.0, "resumed_at": []}

    class Record(TrainerCallback):
        def on_step_end(self, a, st, control, **kw):
            last = rollout.last
            marks = [m for group in last.marks for m in group]
            rows = [(p, i, t) for p, infos, texts in zip(last.prompts, last.infos, last.texts)
                    for i, t in zip(infos, texts)]
            kept = [reward(p, t) for (p, _, t), m in zip(rows, marks) if m.keep]
            proj = trace.since(state["mark"]).project(cost, host_scale=args.host_scale)
            row = {"step": st.global_step, "train_reward": statistics.fmean(kept) if kept else 0.0,
                   "h100_s": proj.total_ms / 1000, "h100_host_s": proj.host_counted_ms / 1000,
                   "host_core_s": proj.host_core_ms / 1000,
                   "host_worker_s": proj.host_worker_ms / 1000,
                   "engine_steps": len(trace.since(state["mark"])),
                   "tokens": last.generated_tokens, "samples": len(rows),
                   "redundant": sum(last.redundant), "rollout_cpu_s": last.wall_s,
                   "groups": len(last.prompts), "carried": last.carried,
                   **{f"partial_{k}": v for k, v in last.staleness.items()},
                   "length": last.generated_tokens / max(len(rows), 1),
                   "ended": {r.value: sum(i.reason is r for _, i, _ in rows) for r in Reason
                             if any(i.reason is r for _, i, _ in rows)},
                   **{f"diag_{k}": v for k, v in trainer.diagnostics.items()}}
            if last.trained is not None:
                row["trained"] = last.trained.to_dict()
                row.update(price_step(row, trainer_cost))
            if feedback is not None:
                row.update({k.replace("/", "_"): v for k, v in feedback.metrics.items()})
            if planner is not None:
                row.update({k.replace("/", "_"): v for k, v in planner.metrics.items()})
            state["spent"] += row[spend] if budget_s is not None else 0.0
            last = st.global_step == max_steps or (budget_s is not None
                                                   and state["spent"] >= budget_s)
            if st.global_step % args.eval_every == 0 or last:
                rollout.load(trainer)                 # this step's weights, then evaluate
                row["heldout"] = _accuracy(llm, held, args)
            if last:
                control.should_training_stop = True
            steps.append(row)
            if args.stop_after is not None and st.global_step > args.stop_after:
                raise Stopped(f"stopped after step {args.stop_after} (--stop-after)")
            state["mark"] = trace.mark()
            if progress is not None:
                progress(name, seed, row)

        def on_log(self, a, st, control, logs=None, **kw):
            if steps and logs and "grad_norm" in logs:   # this step's, before clipping
                steps[-1]["grad_norm"] = float(logs["grad_norm"])

        def on_save(self, a, st, control, **kw):         # after TRL's checkpoint
            train_resume.save(run_dir / f"checkpoint-{st.global_step}",
                              {"steps": steps, "spent": state["spent"], "start": start,
                               "resumed_at": state["resumed_at"]}, rollout)

    torch.manual_seed(seed)
    config = GRPOConfig(
        output_dir=str(run_dir), max_steps=max_steps,   # each step's checkpoint, the last kept
        save_strategy="steps", save_steps=1, save_total_limit=1,
        per_device_train_batch_size=args.prompts * args.m, num_generations=args.m,
        gradient_accumulation_steps=1, learning_rate=args.lr, beta=0.0,
        lr_scheduler_type=args.lr_schedule,
        max_completion_length=args.max_tokens, logging_steps=1, report_to=[],
        seed=seed, use_cpu=True, bf16=False, disable_tqdm=True,
        shuffle_dataset=False)
    trainer = RLGRPOTrainer(model=model, reward_funcs=[masked_reward(_task_reward)],
                            args=config, train_dataset=dataset,
                            processing_class=AutoTokenizer.from_pretrained(MODEL_PATH),
                            rollout_func=rollout, callbacks=[Record()])
    trainer.remove_callback(PrinterCallback)
    t0 = time.perf_counter()
    kind = "stock" if flags is None else "rl"     # every run starts from the same weights
    if checkpoint is not None:                    # a stopped run: on from its last step
        saved = train_resume.restore(checkpoint, rollout, llm)
        steps[:], state["spent"], start = saved["steps"], saved["spent"], saved["start"]
        state["resumed_at"] = saved["resumed_at"] + [len(steps)]
    elif start_cache is not None and kind in start_cache:
        start = start_cache[kind]
    else:
        start = _accuracy(llm, held, args)
        if start_cache is not None:
            start_cache[kind] = start
    state["mark"] = trace.mark()                  # evaluations are not rollout time
    trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
    train_resume.clear(run_dir)
    return {"config": name, "seed": seed, "flags": flags, "heldout_start": start,
            "budget_s": budget_s, "budget_axis": spend, "steps": steps,
            "resumed_at": state["resumed_at"], "trainer_cost": trainer_cost.describe(),
            "wall_s": time.perf_counter() - t0}


class Stopped(RuntimeError):
    """``--stop-after``: a run stopped as if killed, its last step checkpointed (for
    testing ``--resume``)."""


def spend_key(args) -> str:
    """The step row's key a ``--budget`` is spent on: ``e2e_s`` (time: end to end on the
    topology) or ``h100_host_s`` (rollout)."""
    return "h100_host_s" if args.budget == "rollout" else "e2e_s"


def _task_reward(prompts, completions, **_):
    from vllm_rl.task import reward

    return [reward(p, c) for p, c in zip(prompts, completions)]


def _worker(jobs, args_dict, queue) -> None:
    """A worker process: one CPU thread, its own engines, jobs taken from the shared
    ``jobs`` queue until it hands out ``None`` (so the workers stay balanced)."""
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    args = argparse.Namespace(**args_dict)
    from vllm_rl.bench.logs import vllm_log_to

    log = vllm_log_to(Path(args.out) / "vllm.log", announce=False)
    sink = open(log, "a")                 # the worker prints nothing: progress is the parent's
    os.dup2(sink.fileno(), 1)
    os.dup2(sink.fileno(), 2)
    _quiet()
    import torch

    torch.set_num_threads(1)
    engines: dict = {}
    start_cache: dict = {}             # the step-0 accuracy: same weights, same eval samples
    for name, seed, budget_s in iter(jobs.get, None):
        queue.put(("start", name, seed, os.getpid()))
        try:
            _engines(engines)
            result = run_one(name, seed, args, engines,
                             progress=lambda n, s, row: queue.put(("step", n, s, row)),
                             start_cache=start_cache, budget_s=budget_s)
            queue.put(("done", name, seed, result))
        except Exception:               # report, keep the other jobs going
            import traceback

            queue.put(("error", name, seed, traceback.format_exc()))
    queue.put(("exit", None, None, os.getpid()))


def _messages(queue, procs: list):
    """The workers' messages until every worker has exited; a worker that dies (the
    kernel's OOM killer, a crash in native code) ends its run with an error, as a
    failed run does, so its seed's others are not waited for (``--resume`` goes on from
    the run's last checkpointed step)."""
    import queue as queues

    running: dict[int, tuple[str, int]] = {}
    alive = {p.pid for p in procs}
    while alive:
        try:
            kind, name, seed, payload = queue.get(timeout=10)
        except queues.Empty:
            for p in procs:
                if p.pid in alive and not p.is_alive():
                    alive.discard(p.pid)
                    job = running.pop(p.pid, None)
                    if job is not None:
                        yield ("error", *job, f"worker {p.pid} died (exit code {p.exitcode}"
                               "; -9 is the kernel's OOM killer)")
            continue
        if kind == "start":
            running[payload] = (name, seed)
        elif kind in ("done", "error"):
            running = {pid: job for pid, job in running.items() if job != (name, seed)}
        elif kind == "exit":
            alive.discard(payload)
            continue
        yield kind, name, seed, payload


def _quiet() -> None:
    import logging
    import warnings

    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    logging.getLogger("trl").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")


# ----------------------------------------------------------------------------- summary


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
                    "diag_stale_token_share", "diag_token_age_mean"):
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
    where the trainer is charged), the rollout-only axes beside it."""
    first = next(iter(summary.values()), {})
    targets = first.get("levels") or []
    if not targets:
        return ""
    sp0 = first.get("speedup", {})
    main = next((a for a in ("e2e", "rollout", "gpu") if a in sp0), None)
    beside = [a for a in ("rollout", "gpu") if a in sp0 and a != main]
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


# ----------------------------------------------------------------------------- main


# the arguments that decide a run's result (a finished run is reused only if they match)
RUN_ARGS = ("steps", "prompts", "m", "pool", "max_tokens", "lr", "lr_schedule", "eval_every",
            "eval_prompts", "eval_samples", "heldout_seed", "l_detect", "arrol_cold", "cost",
            "host_scale", "budget", "max_steps", "topology", "trainer_cost")


BAR_FORMAT = "{desc}: {percentage:3.0f}%|{bar}| {n:.1f}/{total} [{elapsed}<{remaining}{postfix}]"


def _run_args(args) -> dict:
    return {k: getattr(args, k) for k in RUN_ARGS}


def _finished(out: Path, name: str, seed: int, args) -> dict | None:
    """A run this folder already holds from the same arguments (``--resume``)."""
    path = out / "runs" / f"{name}-s{seed}.json"
    if not path.exists():
        return None
    run = json.loads(path.read_text())
    return run if run.get("args") == _run_args(args) else None


def budget_of(stock_run: dict, args) -> float | None:
    """A configuration's budget for the seed of ``stock_run``: stock's projected time over
    its steps on the budget's axis (:func:`spend_key`: end to end, or the rollout alone;
    None under ``--budget steps``)."""
    if args.budget == "steps":
        return None
    key = spend_key(args)
    return sum(row[key] for row in stock_run["steps"])


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
    names = ["stock"] + [c for c in dict.fromkeys(args.configs.split(",")) if c and c != "stock"]
    unknown = check_configs(names)
    if unknown:
        ap.error(f"unknown configuration(s) {unknown}; choose from {list(CONFIGS)}, a "
                 "'+'-combination of the techniques, or technique:option")
    out = Path(args.out)
    (out / "runs").mkdir(parents=True, exist_ok=True)
    jobs = [(n, s) for s in range(args.seeds) for n in names]
    runs = [r for r in (_finished(out, n, s, args) for n, s in jobs) if r] if args.resume else []
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
