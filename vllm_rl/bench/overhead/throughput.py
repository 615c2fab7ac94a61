"""``vllm-rl bench overhead --mode throughput``: flagless rollouts, the RL engine vs stock.

    vllm-rl bench overhead --mode throughput                 # 5 interleaved repeats, 64 prompts x 8
    vllm-rl bench overhead --mode throughput --repeats 3 --prompts 32 --profile

Two worker processes each hold one in-process engine (``VLLM_ENABLE_V1_MULTIPROCESSING=0``)
on the embedded model:

* ``stock``: ``vllm.LLM`` with vLLM's own scheduler and ``VLLM_PLUGINS=""``, so no
  vllm_rl patch is applied in its process;
* ``rl``: ``vllm_rl.LLM`` (``RLScheduler``, async scheduling) with the vllm_rl plugin
  and every patch applied, ``VLLM_PLUGINS=vllm_rl``.

Both run the same flagless rollout (same prompts, ``n``, seeds, ``max_tokens``) and must
produce the same tokens.  The repeats alternate which engine goes first (stock, rl; rl,
stock; ...) and only one runs at a time.  The figure is the RL engine's throughput
(generated tokens per second) over stock's, per repeat pair, with its median, quartiles,
mean and spread and each pair, by wall time and by the worker's CPU time
(``time.process_time``: all its threads; much less sensitive than wall time to other
work on a shared machine).  Each engine computes on one OpenMP thread by default
(``--threads 1``), so its CPU time is work done, not threads spinning at a barrier while
another process holds the core.  ``--profile`` runs one more rollout on each engine under cProfile
and lists the functions of vllm_rl and its patches with their cumulative time.
JSON goes to ``bench-results/overhead-<time>.json``, vLLM's log to
``bench-results/overhead-vllm-<role>-<engine>.log``.  ``--baseline`` / ``--candidate``
pick other engines for controls: ``stock-patched`` (vLLM's scheduler with the vllm_rl
patches applied) and ``stock-async`` (vLLM's ``AsyncScheduler``, RLScheduler's base
class, which the RL engine keeps on the CPU where vLLM itself turns async scheduling
off); ``--baseline stock --candidate stock`` is an A/A run (the noise floor).
"""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import statistics
import time
from pathlib import Path



# engine kind -> (VLLM_PLUGINS, scheduler_cls for vllm.LLM or "rl" for vllm_rl.LLM)
ENGINES = {
    "stock": ("", None),                          # vLLM as shipped, no vllm_rl process-wide
    "stock-patched": ("vllm_rl", None),           # vLLM's scheduler, vllm_rl patches applied
    "stock-async": ("", "vllm.v1.core.sched.async_scheduler.AsyncScheduler"),  # RL's base
    "rl": ("vllm_rl", "rl"),                      # vllm_rl.LLM: RLScheduler + patches
    # vllm_rl.LLM on RLSyncScheduler (the RL mixin on vLLM's sync Scheduler): what the
    # CPU platform, which turns async scheduling off, runs for stock vLLM
    "rl-sync": ("vllm_rl", "rl:vllm_rl.engine.scheduler.RLSyncScheduler"),
}


def _worker(role: str, engine: str, conn, args: dict) -> None:
    """One engine in this process; runs a rollout per ``"run"`` message."""
    plugins, scheduler = ENGINES[engine]
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ["VLLM_PLUGINS"] = plugins
    if args["threads"]:
        os.environ["OMP_NUM_THREADS"] = str(args["threads"])
    from vllm_rl.bench.logs import vllm_log_to

    vllm_log_to(Path(args["out"]) / f"overhead-vllm-{role}-{engine}.log")
    import vllm
    from vllm import SamplingParams

    from vllm_rl.llm import CPU_KV_CACHE_BYTES
    from vllm_rl.task import kit

    task = kit(args["task"])
    common = dict(seed=0, max_model_len=args["max_model_len"], async_scheduling=True,
                  use_tqdm_on_load=False)
    if scheduler is None or not scheduler.startswith("rl"):
        llm = vllm.LLM(str(task.model_path), kv_cache_memory_bytes=CPU_KV_CACHE_BYTES,
                       scheduler_cls=scheduler, **common)
    else:
        from vllm_rl import LLM

        if ":" in scheduler:
            common["scheduler_cls"] = scheduler.split(":", 1)[1]
        llm = LLM(task.model_path, **common)
    from vllm_rl.patches import applied
    from vllm_rl.patches.input_processor import FlagsAdmission

    patched = applied(FlagsAdmission)
    sched_cls = llm.llm_engine.vllm_config.scheduler_config.get_scheduler_cls()
    sched = f"{sched_cls.__module__}.{sched_cls.__qualname__}"
    prompts = task.heldout_prompts(args["prompts"])
    sp = SamplingParams(n=args["n"], temperature=1.0, max_tokens=args["max_tokens"],
                        seed=args["seed"])
    conn.send({"engine": engine, "patched": patched, "scheduler": sched})
    while True:
        msg = conn.recv()
        if msg == "stop":
            break
        prof = None
        if msg == "profile":
            import cProfile

            prof = cProfile.Profile()
            prof.enable()
        t0, c0 = time.perf_counter(), time.process_time()
        outs = llm.generate(prompts, sp, use_tqdm=False)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        if prof is not None:
            prof.disable()
        tokens = [list(c.token_ids) for o in outs for c in o.outputs]
        result = {"wall_s": wall, "cpu_s": cpu, "tokens": sum(map(len, tokens)),
                  "digest": hash(tuple(map(tuple, tokens)))}
        if prof is not None:
            result["profile"] = _rl_functions(prof)
            result["functions"] = _all_functions(prof)
        conn.send(result)


def _all_functions(prof) -> dict[str, tuple[int, float]]:
    """Every function of a profile: calls and own seconds."""
    import pstats

    return {f"{path}:{line}:{fn}": (nc, tt)
            for (path, line, fn), (cc, nc, tt, ct, _) in pstats.Stats(prof).stats.items()}


def _differences(stock: dict, rl: dict, top: int = 15) -> list[dict]:
    """The functions whose own time grew most from the stock engine to the RL one."""
    rows = []
    for key in set(stock) | set(rl):
        (n0, t0), (n1, t1) = stock.get(key, (0, 0.0)), rl.get(key, (0, 0.0))
        rows.append({"function": key.split("site-packages/")[-1].split("/work/")[-1],
                     "stock_calls": n0, "rl_calls": n1, "stock_own_s": round(t0, 4),
                     "rl_own_s": round(t1, 4), "extra_s": round(t1 - t0, 4)})
    rows.sort(key=lambda r: -r["extra_s"])
    return rows[:top]


def _rl_functions(prof, top: int = 25) -> list[dict]:
    """Cumulative seconds of the vllm_rl functions (package and patches) in a profile."""
    import pstats

    stats = pstats.Stats(prof)
    total = sum(v[3] for k, v in stats.stats.items() if k[2] == "generate") or None
    rows = []
    for (path, line, fn), (cc, nc, tt, ct, _) in stats.stats.items():
        if "vllm_rl" in path or "/patches/" in path:
            rows.append({"function": f"{Path(path).name}:{line}:{fn}", "calls": nc,
                         "tottime_s": round(tt, 4), "cumtime_s": round(ct, 4)})
    rows.sort(key=lambda r: -r["cumtime_s"])
    return [{"generate_s": total}] + rows[:top]


def run(args) -> dict:
    """The throughput A/B (module docstring); ``args`` from :func:`vllm_rl.bench.overhead.command.parser`."""
    Path(args.out).mkdir(parents=True, exist_ok=True)
    wargs = {"prompts": args.prompts, "n": args.n, "max_tokens": args.max_tokens,
             "max_model_len": args.max_model_len, "seed": args.seed, "out": args.out,
             "threads": args.threads, "task": args.task}
    ctx = mp.get_context("spawn")
    workers = {}
    for role, engine in (("stock", args.baseline), ("rl", args.candidate)):
        here, there = ctx.Pipe()
        proc = ctx.Process(target=_worker, args=(role, engine, there, wargs))
        proc.start()
        info = here.recv()
        print(f"{role} = {engine}: scheduler {info['scheduler']}, vllm_rl patches applied: "
              f"{info['patched']}", flush=True)
        workers[role] = (proc, here, info)
        assert info["patched"] == (ENGINES[engine][0] == "vllm_rl")

    def once(engine: str, msg: str = "run") -> dict:
        conn = workers[engine][1]
        conn.send(msg)
        return conn.recv()

    for engine in workers:                      # warm-up, not timed
        once(engine)
    pairs = []
    for r in range(args.repeats):
        order = ("stock", "rl") if r % 2 == 0 else ("rl", "stock")
        res = {e: once(e) for e in order}
        assert res["stock"]["digest"] == res["rl"]["digest"], "different tokens than stock"
        pair = {"order": order, "tokens": res["rl"]["tokens"]}
        for clock in ("wall", "cpu"):
            for e in res:
                pair[f"{e}_{clock}_s"] = round(res[e][f"{clock}_s"], 3)
            # throughput ratio rl / stock = stock seconds / rl seconds (same tokens)
            pair[f"{clock}_ratio"] = res["stock"][f"{clock}_s"] / res["rl"][f"{clock}_s"]
        pairs.append(pair)
        print(f"repeat {r + 1}: {' then '.join(order)}: wall stock {pair['stock_wall_s']:.2f} s"
              f" rl {pair['rl_wall_s']:.2f} s; CPU stock {pair['stock_cpu_s']:.2f} s rl "
              f"{pair['rl_cpu_s']:.2f} s; {pair['tokens']} tokens; throughput rl/stock wall "
              f"{pair['wall_ratio']:.4f}, per CPU second {pair['cpu_ratio']:.4f}", flush=True)
    summary = {}
    for clock in ("wall", "cpu"):
        ratios = [p[f"{clock}_ratio"] for p in pairs]
        q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
        summary[clock] = {"median": statistics.median(ratios), "mean": statistics.fmean(ratios),
                          "stdev": statistics.stdev(ratios) if len(ratios) > 1 else 0.0,
                          "q1": q[0], "q3": q[2], "min": min(ratios), "max": max(ratios)}
        s = summary[clock]
        print(f"\nthroughput rl / stock ({'wall' if clock == 'wall' else 'per CPU second'}) "
              f"over {len(ratios)} interleaved repeats: median {s['median']:.4f} "
              f"(IQR {s['q1']:.4f}-{s['q3']:.4f}, min {s['min']:.4f}, max {s['max']:.4f}), "
              f"mean {s['mean']:.4f} ± {s['stdev']:.4f}; "
              f"overhead (median) {100 * (1 - s['median']):+.2f}%")
    profiles = {}
    if args.profile:
        functions = {}
        for engine in workers:
            res = once(engine, "profile")
            profiles[engine], functions[engine] = res["profile"], res["functions"]
        print("\nvllm_rl functions under cProfile (rl engine, one rollout):")
        print(f"  generate: {profiles['rl'][0]['generate_s']:.2f} s")
        for row in profiles["rl"][1:]:
            print(f"  {row['cumtime_s']:8.4f} s cum  {row['tottime_s']:8.4f} s own  "
                  f"{row['calls']:>8} calls  {row['function']}")
        diff = _differences(functions["stock"], functions["rl"])
        own = {e: sum(t for _, t in functions[e].values()) for e in functions}
        profiles["differences"] = diff
        print(f"\nfunctions whose own time grew most, stock -> rl (profiled totals: stock "
              f"{own['stock']:.2f} s, rl {own['rl']:.2f} s):")
        for row in diff:
            print(f"  {row['extra_s']:+8.4f} s  ({row['stock_own_s']:.4f} -> {row['rl_own_s']:.4f}"
                  f" s, calls {row['stock_calls']} -> {row['rl_calls']})  {row['function']}")
    for proc, conn, _ in workers.values():
        conn.send("stop")
        proc.join(timeout=120)
    out = Path(args.out) / f"overhead-{time.strftime('%Y%m%d-%H%M%S')}.json"
    doc = {"mode": "throughput", "args": vars(args), "pairs": pairs, "summary": summary,
           "profiles": profiles}
    out.write_text(json.dumps(doc, indent=1))
    print(f"\n{out}")
    return doc

