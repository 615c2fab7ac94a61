"""``vllm-rl bench overhead`` (``--mode host``): host time per request-step, RL vs stock.

Two worker processes, one in-process engine each (``VLLM_ENABLE_V1_MULTIPROCESSING=0``,
so the scheduler and the model runner share the process with the step trace), only one
running at a time:

* ``stock``: ``vllm.LLM`` with ``VLLM_PLUGINS=""`` (no vllm_rl patch in its process) and
  vLLM's own scheduler class under :class:`vllm_rl.engine.trace.TraceMixin` (the RL
  engine's base class: ``Scheduler`` where the RL engine schedules synchronously, as
  with DAS, else ``AsyncScheduler``), which times its ``schedule``,
  ``update_from_output`` and ``update_draft_token_ids`` with one ``perf_counter_ns`` pair
  per call and changes nothing else;
* ``rl``: ``vllm_rl.LLM`` (:func:`.engines.rl_engine`: RL scheduler, the same trace,
  every patch applied) as a user builds it for the workload (:data:`ENGINE_OF`): no DAS
  drafter and no ARRoL head for flagless, DARTS and DUET requests; the head for ARRoL;
  the drafter and the head for DAS and all four.  The stock engine of the DAS group has
  no speculative method (vLLM's CPU build has none that samples correctly without
  vllm_rl's patches), so there the RL column also carries vLLM's own speculative
  bookkeeping.

Both get an H100's scheduler limits (:data:`.engines.GPU_LIMITS`: up to 1,024 sequences,
16,384 batched tokens).  A run submits ``live / n`` held-out prompts × ``n`` samples with
one workload's flags (:func:`.matrix.technique_flags`; DARTS groups keep M = n/2 of
n, so they stop early) and ``min_tokens`` (holds the batch at its full size over the
measured window), and steps the engine to the end.  Steps before every sequence has its
first token are prefill steps (reported apart); the figures are over the decode steps
after ``--skip`` with at least ``--live-floor`` × the target live
(:func:`vllm_rl.bench.overhead.budget.run_figures`).  Stock runs the same requests (it ignores the
flags).  Before the timed runs each engine does one untimed run at the largest count
(RL: every technique, which also fills DAS's trees for every prompt).
"""
from __future__ import annotations

import multiprocessing as mp
import os
import time
from pathlib import Path
from typing import Any

WORKLOADS = ("flagless", "darts", "duet", "das", "arrol", "all")
# the RL engine a user builds for each workload: (das, arrol)
ENGINE_OF = {"flagless": "plain", "darts": "plain", "duet": "plain", "arrol": "arrol",
             "das": "das", "all": "das"}
VARIANTS = {"plain": (False, False), "arrol": (False, True), "das": (True, True)}


def workload_params(workload: str, prompts: list[str], args: dict) -> list:
    """One ``SamplingParams`` per prompt for ``workload`` (same seeds on both engines)."""
    from vllm import SamplingParams

    from vllm_rl import rl_params
    from vllm_rl.bench.matrix import technique_flags

    n = args["n"]
    out = []
    for i, prompt in enumerate(prompts):
        flags = None if workload == "flagless" else technique_flags(
            workload, args["max_tokens"], args["l_detect"])
        if flags is not None:
            if "das" in flags:
                flags["das"] = {**flags["das"], "problem_id": prompt}
            if "darts" in flags:
                flags["group"] = {"size": max(1, n // 2), "redundant": n}
        out.append(SamplingParams(n=n, temperature=1.0, max_tokens=args["max_tokens"],
                                  min_tokens=args["min_tokens"], seed=args["seed"] + 7919 * i,
                                  extra_args=rl_params(**flags) if flags else None))
    return out


def _scored(llm) -> int | None:
    try:
        info = llm.arrol_info()
    except Exception:                  # no ARRoL head on this engine
        return None
    if isinstance(info, list):
        return sum(int(i.get("scored", 0)) for i in info if i)
    return int(info.get("scored", 0)) if info else None


def drive(llm, workload: str, live: int, args: dict, tag: str) -> dict[str, Any]:
    """One run: submit, step the engine loop to the end, read the step trace."""
    from vllm.sampling_params import RequestOutputKind

    from vllm_rl.engine.trace import engine_scheduler, engine_trace
    from vllm_rl.task import kit

    prompts = kit(args["task"]).heldout_prompts(max(1, live // args["n"]))
    params = workload_params(workload, prompts, args)
    trace, sched = engine_trace(llm), engine_scheduler(llm)
    scored0 = _scored(llm) if args["role"] == "rl" else None
    mark = trace.mark()
    engine = llm.llm_engine
    t0 = time.perf_counter()
    for i, (prompt, sp) in enumerate(zip(prompts, params)):
        sp.output_kind = RequestOutputKind.FINAL_ONLY
        engine.add_request(f"{tag}-{i}", prompt, sp)
    decode_from, finished = None, 0
    while engine.has_unfinished_requests():
        if decode_from is None and not len(sched.waiting) and all(
                r.num_output_tokens > 0 for r in sched.running):
            decode_from = len(trace) - mark[0]      # every later step is a decode step
        for out in engine.step():
            finished += out.finished
    wall = time.perf_counter() - t0
    steps = trace.since(mark)
    n = len(steps)
    live_per_step = [steps._offsets[i + 1] - steps._offsets[i] for i in range(n)]
    tokens = [int(sum(w)) for w, _ in steps.steps()]
    start = n if decode_from is None else decode_from
    scored = None
    if scored0 is not None:
        scored = _scored(llm) - scored0
    return {"engine": args["role"], "workload": workload, "live": live, "wall_s": wall,
            "prompts": len(prompts), "live_per_step": live_per_step, "tokens": tokens,
            "decode": [i >= start for i in range(n)],
            "schedule_ns": list(steps.schedule_ns), "update_ns": list(steps.update_ns),
            "drafter_ns": list(steps.drafter_ns), "scorer_ns": list(steps.scorer_ns),
            "scored_rows": scored, "requests_finished": finished}


def _worker(role: str, conn, args: dict) -> None:
    """One engine in this process; one run per ``("run", workload, live, tag)`` message."""
    args = {**args, "role": role}
    os.environ["VLLM_PLUGINS"] = "vllm_rl" if role == "rl" else ""
    if args["threads"]:
        os.environ["OMP_NUM_THREADS"] = str(args["threads"])
    from vllm_rl.bench.engines import GPU_LIMITS, _common, in_process

    in_process()
    from vllm_rl.bench.logs import vllm_log_to

    vllm_log_to(Path(args["out"]) / f"overhead-vllm-host-{role}.log", announce=False)
    from vllm_rl.task import kit

    model = args["model"] or str(kit(args["task"]).model_path)
    kv = int(args["kv_gib"] * (1 << 30))
    if role == "rl":
        from vllm_rl.bench.engines import rl_engine

        das, arrol = VARIANTS[args["variant"]]
        llm = rl_engine(model, args["seed"], True, kv, max_model_len=args["max_model_len"],
                        das=das, arrol=arrol, cost=args["cost"])
    else:
        import vllm

        from vllm_rl.engine.trace import (CONFIG_KEY, TRACED_SCHEDULER_CLS,
                                          TRACED_SYNC_SCHEDULER_CLS)

        asynchronous = bool(args["asynchronous"])
        common = _common(args["seed"], True, kv, args["max_model_len"])
        common["additional_config"][CONFIG_KEY] = True
        llm = vllm.LLM(model, scheduler_cls=TRACED_SCHEDULER_CLS if asynchronous
                       else TRACED_SYNC_SCHEDULER_CLS, async_scheduling=asynchronous,
                       **common)
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm_rl.patches import applied
    from vllm_rl.patches.input_processor import FlagsAdmission

    from vllm_rl.engine.trace import engine_scheduler

    sched = engine_scheduler(llm)
    cls = type(sched)
    conn.send({"role": role, "scheduler": f"{cls.__module__}.{cls.__qualname__}",
               "asynchronous": isinstance(sched, AsyncScheduler),
               "patched": applied(FlagsAdmission),
               "limits": {k: getattr(llm.llm_engine.vllm_config.scheduler_config, k)
                          for k in GPU_LIMITS}})
    while True:
        msg = conn.recv()
        if msg == "stop":
            break
        _, workload, live, tag = msg
        try:
            conn.send(drive(llm, workload, live, args, tag))
        except Exception as e:          # report, keep the other runs going
            conn.send({"error": f"{type(e).__name__}: {e}"})


def das_host_figures(lives: list[int], steps: int, cost: str | None) -> dict:
    """The DAS drafter alone at each live count (``--das-host STEPS``):
    ``vllm_rl.bench.overhead.das_drafter.measure(rows, steps)`` where it exists, in this process."""
    try:
        from vllm_rl.bench.overhead.das_drafter import measure
    except ImportError as e:
        return {"error": f"vllm_rl.bench.overhead.das_drafter.measure unavailable: {e}"}
    out: dict = {}
    for live in lives:
        try:
            out[live] = measure(live, steps, cost=cost)
        except Exception as e:          # the drafter is another team's moving code
            out[live] = {"error": f"{type(e).__name__}: {e}"}
    return out


def _recv(proc, conn, what: str):
    """The worker's next message; fails (instead of waiting forever) if it died."""
    while not conn.poll(1.0):
        if not proc.is_alive():
            raise RuntimeError(f"the {what} worker exited ({proc.exitcode}); its traceback "
                               "is above, vLLM's log in --out")
    return conn.recv()


def _start(ctx, wargs: dict, engines: dict, group: str) -> dict[str, tuple[Any, Any]]:
    """The RL and the stock engine of one group, each in its own process (the stock one
    on the RL engine's base scheduler class)."""
    workers: dict[str, tuple[Any, Any]] = {}
    wargs = dict(wargs)
    for role in ("rl", "stock"):        # rl first: stock takes the RL engine's base class
        here, there = ctx.Pipe()
        proc = ctx.Process(target=_worker, args=(role, there, wargs))
        proc.start()
        workers[role] = (proc, here)
        try:
            info = _recv(proc, here, role)
        except RuntimeError:
            _stop(workers)
            raise
        engines[f"{group}:{role}"] = info
        wargs["asynchronous"] = info["asynchronous"] if role == "rl" else wargs["asynchronous"]
        print(f"{group} {role}: scheduler {info['scheduler']} "
              f"({'async' if info['asynchronous'] else 'sync'}), vllm_rl patches applied: "
              f"{info['patched']}, limits {info['limits']}", flush=True)
        assert info["patched"] == (role == "rl"), "stock must run without vllm_rl patches"
    return workers


def _ask(workers: dict, role: str, workload: str, live: int, tag: str) -> dict:
    proc, conn = workers[role]
    conn.send(("run", workload, live, tag))
    res = _recv(proc, conn, role)
    if "error" in res:
        raise RuntimeError(f"{role} {workload} at {live} live: {res['error']}")
    return res


def _stop(workers: dict) -> None:
    for proc, conn in workers.values():
        if proc.is_alive():
            try:
                conn.send("stop")
            except OSError:
                pass
            proc.join(timeout=120)
            if proc.is_alive():
                proc.terminate()


def run(args) -> dict:
    """The host-budget benchmark (module docstring): table, JSON, PNG."""
    from vllm_rl.bench.overhead import budget as ob

    lives = sorted({int(x) for x in str(args.live).split(",") if x})
    workloads = [w for w in args.workloads.split(",") if w]
    bad = set(workloads) - set(WORKLOADS)
    if bad:
        raise SystemExit(f"vllm-rl bench overhead: unknown workload(s) {sorted(bad)}; "
                         f"choose from {', '.join(WORKLOADS)}")
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    wargs = {"n": args.n, "max_tokens": args.max_tokens, "min_tokens": args.min_tokens,
             "l_detect": args.l_detect, "seed": args.seed, "out": args.out,
             "threads": args.threads, "model": args.model, "kv_gib": args.kv_gib,
             "max_model_len": args.max_model_len, "cost": args.cost, "asynchronous": None,
             "task": args.task}
    ctx = mp.get_context("spawn")
    engines: dict[str, Any] = {}
    runs: list[dict] = []
    t_start = time.perf_counter()
    top = max(lives)
    groups = [g for g in VARIANTS if any(ENGINE_OF[w] == g for w in workloads)]
    k = 0
    total = args.repeats * len(lives) * len(workloads)
    for group in groups:
        group_workloads = [w for w in workloads if ENGINE_OF[w] == group]
        workers = _start(ctx, {**wargs, "variant": group}, engines, group)
        try:
            print(f"[{group} engines] warm-up at {top} live (untimed)", flush=True)
            _ask(workers, "stock", "flagless", top, "warm")
            _ask(workers, "rl", "all" if group == "das" else group_workloads[-1], top, "warm")
            plan = [(rep, live, w) for rep in range(args.repeats) for live in lives
                    for w in group_workloads]
            for rep, live, workload in plan:
                order = ("stock", "rl") if k % 2 == 0 else ("rl", "stock")
                k += 1
                line = []
                for role in order:
                    res = _ask(workers, role, workload, live, f"r{rep}-{live}-{workload}")
                    figs = ob.run_figures({**res, "live": res["live_per_step"]}, live,
                                          args.live_floor, args.skip, args.outlier)
                    runs.append({"engine": role, "workload": workload, "live": live,
                                 "repeat": rep, "order": list(order), "variant": group,
                                 "wall_s": res["wall_s"], "figures": figs,
                                 "raw": {k2: res[k2] for k2 in (
                                     "live_per_step", "tokens", "decode", "schedule_ns",
                                     "update_ns", "drafter_ns", "scorer_ns")}})
                    line.append(f"{role} {ob._f(figs['core_us'])} µs"
                                + (f" +drafter {ob._f(figs['drafter_us'], '{:.3f}')}"
                                   f" +scorer {ob._f(figs['scorer_us'])}" if role == "rl" else ""))
                print(f"[{k}/{total}] repeat {rep + 1}, {live} live, {workload} ({group} "
                      f"engines): sched+update per request-step: {', '.join(line)}", flush=True)
        finally:
            _stop(workers)
    das_host = das_host_figures(lives, args.das_host, args.cost) if args.das_host else None
    stamp = time.strftime("%Y%m%d-%H%M%S")
    doc = ob.document(vars(args), engines, runs,
                      {"total_s": time.perf_counter() - t_start,
                       "load_avg": os.getloadavg(), "cpus": os.cpu_count(),
                       "das_host": das_host})
    path = out_dir / f"overhead-{stamp}.json"
    import json

    path.write_text(json.dumps(doc, indent=1))
    png = ob.picture(doc["rows"], out_dir / f"overhead-{stamp}.png",
                     f"Host time per request-step at {top} live sequences (median of "
                     f"{args.repeats}; min–max bars), vLLM vs the RL engine")
    print(f"\nHost time per request-step (µs), decode steps with ≥ {args.live_floor:g} × "
          f"the live target, after {args.skip} warm-up decode steps; median of "
          f"{args.repeats} interleaved repeats. 'RL / vLLM' is schedule+update, paired by "
          f"repeat; flagless is judged on the RL engine's whole host time (+ drafter + "
          f"scorer) within stock's noise (±{100 * ob.FLAGLESS_NOISE_FLOOR:.0f}% or its "
          f"spread). Load average at the end {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} CPUs.\n")
    print(ob.table(doc["rows"]))
    if das_host:
        print("\nDAS drafter without an engine (vllm_rl.bench.overhead.das_drafter.measure, CPU µs per "
              f"request-step, budget ≤ {ob.DRAFTER_US_BUDGET:g}):")
        for live, res in das_host.items():
            if not isinstance(res, dict) or "error" in res:
                print(f"  {live}: {res if not isinstance(res, dict) else res['error']}")
                continue
            total = res["us_per_request_step"]["total"]
            verdict = "pass" if total <= ob.DRAFTER_US_BUDGET else "FAIL"
            print(f"  {live} rows: {total:.3f} µs ({verdict}), {res['us_per_request_step']}")
    print(f"\nall budgets pass: {doc['all_pass']}\nresults: {path}\npicture: {png}\n"
          f"vLLM's logs: {out_dir}/overhead-vllm-host-{{stock,rl}}.log\n"
          f"total {doc['total_s']:.0f} s")
    return doc


__all__ = ["WORKLOADS", "drive", "run", "workload_params"]
