"""One ``vllm-rl bench train`` run, in a worker process: TRL's GRPO on the embedded model
with rollouts from an in-process engine (:func:`run_one`), each step recorded, priced
(:mod:`vllm_rl.bench.train.budget`) and checkpointed (:mod:`vllm_rl.bench.train.resume`);
the workers (:func:`_worker`) and the parent's view of them (:func:`_messages`)."""
from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

from vllm_rl.bench.train import resume as train_resume
from vllm_rl.bench.matrix import parse, technique_flags
from vllm_rl.bench.train.budget import price_step, spend_key
from vllm_rl.cost.trainer import TrainerCost


def _engines(cache: dict, task) -> dict:
    """The worker's two in-process engines on the kit ``task``'s model, made once: stock
    vLLM (its own scheduler, traced) and the RL engine (DAS drafter, ARRoL head, traced)."""
    if not cache:
        from vllm_rl.bench.engines import rl_engine, stock_engine

        model = str(task.model_path)
        cache["stock"] = stock_engine(model, max_model_len=task.max_model_len)
        cache["rl"] = rl_engine(model, max_model_len=task.max_model_len)
    return cache


def _reset(llm, hidden_size: int) -> None:
    """A run starts from a clean RL engine: no trees, an untrained head scoring only,
    DUET's online thresholds from their cold start."""
    from vllm_rl.arrol.head import QualityHead
    from vllm_rl.engine.trace import engine_scheduler

    llm.das_clear()
    llm.arrol_update(head=QualityHead(hidden_size).export(0), cold_start=True, version=0)
    engine_scheduler(llm).duet_thresholds.clear()


def _kit(args):
    from vllm_rl.task.kits import DEFAULT, kit

    return kit(getattr(args, "task", DEFAULT))


def _heldout(args) -> list[str]:
    task = _kit(args)
    if args.heldout_seed is None:
        return task.heldout_prompts(args.eval_prompts)
    return task.outside_prompts(args.heldout_seed, args.eval_prompts, args.pool)


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
    steps.  Each finished step is checkpointed (:mod:`vllm_rl.bench.train.resume`); with
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
    from vllm_rl.task import reward
    from vllm_rl.weights import load_weights

    flags = technique_flags(name, args.max_tokens, args.l_detect)
    llm = engines["stock" if flags is None else "rl"]
    task = _kit(args)
    model = AutoModelForCausalLM.from_pretrained(task.model_path)
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
                               guard="guard" in options.get("darts", ()),
                               regime_gate="regime" in options.get("darts", ()))
    gate_only = "gate" in options.get("duet", ())
    regime_log = (Path(args.out) / "runs" / f"{name}-s{seed}-regime.jsonl"
                  if getattr(args, "regime_log", False) else None)
    rollout = RolloutFunc(llm, flags, max_tokens=args.max_tokens, seed=seed,
                          problem_id=lambda p: p, arrol_feedback=feedback, planner=planner,
                          reward=reward if feedback is not None or regime_log else None,
                          duet_allocation=None if gate_only else "auto",
                          partial=partial_setting(name), regime_log=regime_log)
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
    pool = task.train_prompts(args.pool)
    order = []
    rng = random.Random(seed)
    while len(order) < max_steps * args.prompts:
        epoch = list(pool)
        rng.shuffle(epoch)
        order += epoch
    dataset = Dataset.from_dict({"prompt": order[:max_steps * args.prompts]})
    steps: list[dict] = []
    state = {"mark": trace.mark(), "clock": _clock(), "spent": 0.0, "resumed_at": []}

    class Record(TrainerCallback):
        def on_step_end(self, a, st, control, **kw):
            last = rollout.last
            marks = [m for group in last.marks for m in group]
            rows = [(p, i, t) for p, infos, texts in zip(last.prompts, last.infos, last.texts)
                    for i, t in zip(infos, texts)]
            kept = [reward(p, t) for (p, _, t), m in zip(rows, marks) if m.keep]
            cpu, wall = time.process_time(), time.perf_counter()
            cpu_share = (cpu - state["clock"][0]) / max(wall - state["clock"][1], 1e-9)
            since = trace.since(state["mark"])
            proj = since.project(cost, host_scale=args.host_scale)
            row = {"step": st.global_step, "train_reward": statistics.fmean(kept) if kept else 0.0,
                   "h100_s": proj.total_ms / 1000, "h100_host_s": proj.host_counted_ms / 1000,
                   "host_core_s": proj.host_core_ms / 1000,
                   "host_worker_s": proj.host_worker_ms / 1000,
                   "host_gc_s": sum(since.gc_ms()) / 1000, "cpu_share": cpu_share,
                   "engine_steps": len(since),
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
            state["mark"], state["clock"] = trace.mark(), _clock()
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
    micro = micro_batch(args)
    config = GRPOConfig(
        output_dir=str(run_dir), max_steps=max_steps,   # each step's checkpoint, the last kept
        save_strategy="steps", save_steps=1, save_total_limit=1,
        # one optimizer step per rollout step: the step's rows in micro-batches of
        # --micro-batch accumulated (the same gradient, less memory), by default one
        per_device_train_batch_size=micro, num_generations=args.m,
        gradient_accumulation_steps=args.prompts * args.m // micro,
        learning_rate=args.lr, beta=0.0,
        lr_scheduler_type=args.lr_schedule,
        max_completion_length=args.max_tokens, logging_steps=1, report_to=[],
        seed=seed, use_cpu=True, bf16=False, disable_tqdm=True,
        shuffle_dataset=False)
    trainer = RLGRPOTrainer(model=model, reward_funcs=[masked_reward(_task_reward)],
                            args=config, train_dataset=dataset,
                            processing_class=AutoTokenizer.from_pretrained(task.model_path),
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
    state["mark"], state["clock"] = trace.mark(), _clock()   # evaluations are not rollout time
    trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
    train_resume.clear(run_dir)
    return {"config": name, "seed": seed, "flags": flags, "heldout_start": start,
            "budget_s": budget_s, "budget_axis": spend, "steps": steps,
            "resumed_at": state["resumed_at"], "trainer_cost": trainer_cost.describe(),
            "wall_s": time.perf_counter() - t0}


def _clock() -> tuple[float, float]:
    """The process's CPU time and the wall clock: over a step, their ratio is the share of
    a CPU the run had (``cpu_share``; well under 1 where other processes took its core,
    which inflates every host time the trace measures)."""
    return time.process_time(), time.perf_counter()


class Stopped(RuntimeError):
    """``--stop-after``: a run stopped as if killed, its last step checkpointed (for
    testing ``--resume``)."""


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
            _engines(engines, _kit(args))
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


def micro_batch(args) -> int:
    """The trainer's micro-batch: ``--micro-batch`` rows (it must divide the step's
    prompts × M), or the whole step."""
    rows = args.prompts * args.m
    micro = getattr(args, "micro_batch", None) or rows
    if rows % micro:
        raise ValueError(f"--micro-batch {micro} must divide the step's {rows} rows")
    return micro
