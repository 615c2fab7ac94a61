"""The engines every benchmark compares: stock vLLM and the RL engine, both traced.

Every engine schedules asynchronously, as vLLM does on a GPU (on this CPU through
``vllm_rl_async_cpu``, ``patches/model_runner/das_async.py``; the DAS engine included).  They run
in-process (the step trace lives in the engine core) and record every engine
step (:mod:`vllm_rl.engine.trace`), so each run's steps can be priced on a GPU step-cost
table.  ``gpu_limits=True`` gives them the scheduler limits vLLM uses on an H100 (the
offline defaults of ``EngineArgs`` for a GPU of at least 70 GiB), so the batch shapes are
the GPU's; otherwise vLLM's CPU defaults.
"""
from __future__ import annotations

import os
from typing import Any

# vLLM's offline defaults on an H100 (EngineArgs, >= 70 GiB and not an A100).
GPU_LIMITS = {"max_num_seqs": 1024, "max_num_batched_tokens": 16384}


def in_process() -> None:
    """Engines in this process (the trace lives in the engine core); call before vLLM
    starts one."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")   # torch's C++ NUMA warnings


def _common(seed: int, gpu_limits: bool, kv_bytes: int | None, max_model_len: int) -> dict:
    from vllm_rl.llm import CPU_KV_CACHE_BYTES
    from vllm_rl.settings import CPU_ASYNC_KEY

    # every engine schedules as on a GPU (async; vLLM's CPU platform would make it sync)
    out: dict[str, Any] = dict(seed=seed, max_model_len=max_model_len,
                               kv_cache_memory_bytes=kv_bytes or CPU_KV_CACHE_BYTES,
                               use_tqdm_on_load=False,
                               additional_config={CPU_ASYNC_KEY: True})
    if gpu_limits:
        out.update(GPU_LIMITS)
    return out


def stock_engine(model: str, seed: int = 0, gpu_limits: bool = False,
                 kv_bytes: int | None = None, max_model_len: int = 1024):
    """Stock vLLM: its own scheduler, with the step trace only (no vllm_rl logic)."""
    import vllm

    from vllm_rl.engine.trace import CONFIG_KEY, TRACED_SCHEDULER_CLS

    common = _common(seed, gpu_limits, kv_bytes, max_model_len)
    common["additional_config"][CONFIG_KEY] = True
    return vllm.LLM(model, scheduler_cls=TRACED_SCHEDULER_CLS, **common)


def rl_engine(model: str, seed: int = 0, gpu_limits: bool = False, kv_bytes: int | None = None,
              max_model_len: int = 1024, das: Any = True, arrol: Any = True,
              cost: str | None = None):
    """The RL engine with the step trace, the DAS drafter and ARRoL's head by default (a
    request uses only the techniques its flags name; the others cost it nothing)."""
    from vllm_rl import LLM

    return LLM(model, trace=True, das=das, arrol=arrol, cost=cost,
               **_common(seed, gpu_limits, kv_bytes, max_model_len))


def shutdown(*llms) -> None:
    for llm in llms:
        llm.llm_engine.engine_core.shutdown()


__all__ = ["GPU_LIMITS", "in_process", "rl_engine", "shutdown", "stock_engine"]
