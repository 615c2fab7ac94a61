"""``vllm-rl bench overhead --mode scheduler``: the schedulers alone, on hand-built outputs.

No model, no worker: a real vLLM ``Scheduler`` and a real
:class:`~vllm_rl.engine.scheduler.RLSyncScheduler` on the embedded model's config with
an H100's limits (1,024 sequences), stepped with ``schedule()`` and
``update_from_output()`` on hand-built ``ModelRunnerOutput`` s, as vLLM tests its own
scheduler.  Both run the same requests and the same sampled tokens: each sample draws its
natural length from its seed (uniform in ``[max_tokens / 4, max_tokens]``) and samples
EOS there; the RL scheduler applies each workload's rules on top (DARTS groups of 8
stop when their 4 shortest are known, DUET polls from K1 and gates at K2 + G, ARRoL
verdicts arrive at ``l_detect`` as the worker would attach them, half of them pruning),
so its early ends, records and freed blocks are all in its time.  The figure is host
time per request-step: the summed time of ``schedule`` plus ``update_from_output`` over
the summed live requests of the steps, for every step from the first to the last.
Because nothing else runs, it is steady to a few percent even on a shared machine, and it
is exactly the part of the host time the RL scheduler adds to vLLM's; the model
runner's parts (DAS's drafter, ARRoL's scorer) are measured by ``--mode host`` and
``vllm_rl.bench.overhead.das_drafter``.
"""
from __future__ import annotations

import gc
import random
import statistics
import time
from collections import Counter
from typing import Any

WORKLOADS = ("flagless", "darts", "duet", "arrol", "all")
BLOCK = 16
ARROL_AT = 16
EOS = 0
TOKEN = 7


def _flags(workload: str, i: int, max_tokens: int) -> dict | None:
    """Sample ``i``'s flags: DARTS groups of 8 keeping their 4 shortest, DUET with K1 at
    an eighth and K2 at half of ``max_tokens``, ARRoL scored at token 16."""
    from vllm_rl import rl_params

    parts: dict[str, Any] = {}
    if workload in ("darts", "all"):
        parts.update(group={"id": f"g{i // 8}", "size": 4, "redundant": 8},
                     darts={"mode": "shortest"})
    if workload in ("duet", "all"):
        parts.update(duet={"k1": max_tokens // 8, "k2": max_tokens // 2,
                           "grace": max_tokens // 8})
    if workload in ("arrol", "all"):
        parts.update(arrol={"l_detect": ARROL_AT})
    return rl_params(**parts) if parts else None


def standalone_scheduler(cls, max_num_seqs: int, max_model_len: int, num_blocks: int,
                         max_num_batched_tokens: int = 16384, prefix_caching: bool = False,
                         speculative: dict | None = None):
    """A vLLM scheduler of class ``cls`` with no engine and no worker, as vLLM tests its
    own (``tests/v1/core/utils.py``): the embedded model's config on the CPU and a KV
    cache of ``num_blocks`` blocks of :data:`BLOCK` tokens (also the scheduler unit
    tests' harness, ``tests/unit/test_scheduler_rules.py``).  ``speculative``: vLLM's
    ``speculative_config`` arguments (a drafter configured, as ``vllm.LLM`` takes them)."""
    import torch
    from vllm.config import (CacheConfig, DeviceConfig, ModelConfig, ParallelConfig,
                             SchedulerConfig, SpeculativeConfig, VllmConfig)
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    from vllm_rl.engine.scheduler import RLSchedulerMixin
    from vllm_rl.plugin import enable
    from vllm_rl.task import MODEL_PATH

    if issubclass(cls, RLSchedulerMixin):
        enable()            # an RL scheduler: this process asks for vllm_rl's patches
    model = ModelConfig(model=str(MODEL_PATH), dtype="float32", seed=0,
                        max_model_len=max_model_len)
    spec = None if speculative is None else SpeculativeConfig(
        **speculative, target_model_config=model, target_parallel_config=ParallelConfig())
    config = VllmConfig(
        scheduler_config=SchedulerConfig(max_num_seqs=max_num_seqs,
                                         max_num_batched_tokens=max_num_batched_tokens,
                                         max_model_len=max_model_len,
                                         enable_chunked_prefill=True,
                                         is_encoder_decoder=False),
        model_config=model, speculative_config=spec,
        cache_config=CacheConfig(block_size=BLOCK, enable_prefix_caching=prefix_caching),
        device_config=DeviceConfig("cpu"))
    kv = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec(["layer"], FullAttentionSpec(block_size=BLOCK, num_kv_heads=1,
                                                      head_size=1, dtype=torch.float32))])
    config.cache_config.num_gpu_blocks = num_blocks
    return cls(vllm_config=config, kv_cache_config=kv, block_size=BLOCK,
               structured_output_manager=StructuredOutputManager(config), log_stats=True)


def run_once(rl: bool, workload: str, live: int, max_tokens: int = 256,
             prompt_len: int = 64, seed: int = 0) -> dict[str, Any]:
    """One rollout of ``live`` samples on vLLM's ``Scheduler`` (``rl=False``) or the RL
    scheduler; returns the summed host ns and request-steps, and the ends by reason."""
    from vllm.sampling_params import SamplingParams
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request

    from vllm_rl.arrol.rule import ArrolVerdict
    from vllm_rl.engine.scheduler import RLSyncScheduler
    from vllm_rl.flags import KEY, read
    from vllm_rl.step_output import attach
    from vllm_rl.outcome import RolloutInfo

    max_model_len = prompt_len + max_tokens + 16
    sched = standalone_scheduler(RLSyncScheduler if rl else Scheduler, live, max_model_len,
                                 live * (max_model_len // BLOCK + 2))
    rng = random.Random(seed)
    length, arrol_at, prune = {}, {}, {}
    for i in range(live):
        rid = str(i)
        flags = _flags(workload, i, max_tokens) if rl else None
        extra = {KEY: read(flags, n=1, default_group_id=rid).canonical()} if flags else None
        params = SamplingParams(max_tokens=max_tokens, seed=seed * 100_003 + i,
                                extra_args=extra)
        params.update_from_generation_config({}, eos_token_id=EOS)
        prompt = [3 + (i // 8) % 50] * prompt_len
        sched.add_request(Request(rid, prompt, params, None))
        length[rid] = rng.randint(max_tokens // 4, max_tokens)
        if flags and workload in ("arrol", "all"):
            arrol_at[rid] = ARROL_AT
            prune[rid] = rng.random() < 0.5
    ends: Counter = Counter()
    host_ns = steps = request_steps = 0
    gc.collect()
    gc.disable()
    try:
        while sched.has_unfinished_requests():
            t0 = time.perf_counter_ns()
            so = sched.schedule()
            t1 = time.perf_counter_ns()
            ids = list(so.num_scheduled_tokens)
            sampled, verdicts = [], {}
            for rid in ids:
                req = sched.requests[rid]
                done = req.num_computed_tokens + so.num_scheduled_tokens[rid] \
                    >= req.num_prompt_tokens
                n = req.num_output_tokens + 1
                sampled.append([] if not done else [EOS if n >= length[rid] else TOKEN])
                if rl and arrol_at.get(rid) == n - 1 and done:
                    verdicts[rid] = ArrolVerdict(0.1, 0.2, 0.5, prune[rid], 1, False, None)
            out = ModelRunnerOutput(req_ids=ids,
                                    req_id_to_index={r: j for j, r in enumerate(ids)},
                                    sampled_token_ids=sampled)
            if verdicts:
                attach(out).verdicts.update(verdicts)    # as the ARRoL scorer does
            t2 = time.perf_counter_ns()
            outputs = sched.update_from_output(so, out)
            t3 = time.perf_counter_ns()
            host_ns += (t1 - t0) + (t3 - t2)
            steps += 1
            request_steps += len(ids)
            for eco in outputs.values():
                for o in eco.outputs:
                    if o.finish_reason is not None:
                        info = RolloutInfo.decode(o.stop_reason)
                        ends[info.reason.value if info is not None else "stock"] += 1
    finally:
        gc.enable()
    return {"host_ns": host_ns, "steps": steps, "request_steps": request_steps,
            "ends": dict(ends)}


def measure(workloads=WORKLOADS, live: int = 1024, repeats: int = 3,
            max_tokens: int = 256, progress=print) -> list[dict[str, Any]]:
    """Per workload: µs per request-step of vLLM's scheduler and the RL scheduler (best
    and median of ``repeats`` interleaved pairs), and their ratio."""
    rows = []
    for workload in workloads:
        stock, rl, ends = [], [], {}
        for rep in range(repeats):
            for is_rl in ((False, True) if rep % 2 == 0 else (True, False)):
                r = run_once(is_rl, workload, live, max_tokens, seed=rep)
                us = r["host_ns"] / 1e3 / r["request_steps"]
                (rl if is_rl else stock).append(us)
                if is_rl:
                    ends = r["ends"]
        row = {"workload": workload, "live": live, "stock_us": statistics.median(stock),
               "rl_us": statistics.median(rl), "stock_best_us": min(stock),
               "rl_best_us": min(rl), "ratio": statistics.median(rl) / statistics.median(stock),
               "ratio_best": min(rl) / min(stock), "rl_ends": ends, "repeats": repeats}
        rows.append(row)
        progress(f"  {workload}: vLLM {row['stock_us']:.2f} µs, RL {row['rl_us']:.2f} µs "
                 f"per request-step (x{row['ratio']:.3f}); RL ends {ends}")
    return rows


def table(rows: list[dict[str, Any]], budget: float = 1.25) -> str:
    """The Markdown table of :func:`measure`'s rows with the budget verdicts (flagless:
    within noise, ±5%; flagged: at most ``budget`` × vLLM's)."""
    out = ["| live | workload | vLLM µs/request-step | RL µs/request-step | RL / vLLM "
           "(median; best) | budget |", "|---|---|---|---|---|---|"]
    for r in rows:
        limit = 1.05 if r["workload"] == "flagless" else budget
        verdict = "pass" if r["ratio"] <= limit else "FAIL"
        out.append(f"| {r['live']} | {r['workload']} | {r['stock_us']:.2f} | {r['rl_us']:.2f} "
                   f"| {r['ratio']:.3f}; {r['ratio_best']:.3f} | {verdict} (≤ {limit:g}) |")
    return "\n".join(out)


def run(args) -> dict[str, Any]:
    """``vllm-rl bench overhead --mode scheduler``: :func:`measure` at each ``--live``
    count, the table on stdout and JSON in ``--out``."""
    import json
    import os
    from pathlib import Path

    lives = sorted({int(x) for x in str(args.live).split(",") if x})
    workloads = [w for w in args.workloads.split(",") if w in WORKLOADS]
    print(f"schedulers alone (hand-built outputs), {args.repeats} interleaved repeats, "
          f"max_tokens {args.max_tokens}; workloads {', '.join(workloads)} (DAS's drafter "
          f"and ARRoL's scorer are the worker's: --mode host)", flush=True)
    rows = []
    for live in lives:
        print(f"{live} live:", flush=True)
        rows += measure(workloads, live, args.repeats, args.max_tokens)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"overhead-scheduler-{time.strftime('%Y%m%d-%H%M%S')}.json"
    doc = {"mode": "scheduler", "args": {k: v for k, v in vars(args).items()
                                         if isinstance(v, (int, float, str, type(None)))},
           "rows": rows, "load_avg": os.getloadavg(), "cpus": os.cpu_count()}
    path.write_text(json.dumps(doc, indent=1))
    print("\n" + table(rows) + f"\n\nresults: {path}")
    return doc


__all__ = ["WORKLOADS", "measure", "run", "run_once", "standalone_scheduler", "table"]
