"""New weights into a running engine: one RL step's policy, in place.

:func:`load_weights` goes through vLLM's own ``reload_weights`` (vLLM 0.32's in-place
reload from ``(name, tensor)`` pairs, which restores what the first load processed) on
every worker, then makes the weight sync's cache side (:func:`weight_sync`): the prefix
cache is reset with the requests in flight recomputed on the new weights, so no request
reads KV computed with older weights, and the answer says what happened.
On a vllm_rl engine the RL state stays: the DAS trees, the ARRoL head and calibration,
DUET's online thresholds and the group registry live outside the weights.

In-process engines get the tensors by reference.  A multiprocess engine core cannot take
tensors inside ``collective_rpc`` arguments (vLLM's msgpack turns them into lists), so the
state is sent as one ``torch.save`` buffer to :meth:`WeightsWorkerExtension.vllm_rl_reload_weights`,
part of every vllm_rl engine's worker extension.  That copies the weights through the
engine's RPC: right for the CPU and for small models; on GPUs the frameworks' own paths
(verl's CUDA IPC, OpenRLHF's NCCL) move the weights.
"""
from __future__ import annotations

import io
from typing import Any, Iterable


def _pairs(weights: Any, dtype: Any = None) -> list[tuple[str, Any]]:
    """``(name, tensor)`` pairs, floating tensors cast to the engine's ``dtype`` (vLLM's
    reload refuses a float32 tensor for a bfloat16 parameter)."""
    pairs = list(weights.items() if hasattr(weights, "items") else weights)
    if dtype is None:
        return pairs
    return [(n, t.to(dtype) if t.is_floating_point() else t) for n, t in pairs]


def engine_dtype(llm: Any) -> Any:
    return llm.llm_engine.vllm_config.model_config.dtype


def pack(weights: Any) -> bytes:
    """``(name, tensor)`` pairs or a state dict as one ``torch.save`` buffer (CPU tensors)."""
    import torch

    buf = io.BytesIO()
    torch.save({name: t.detach().cpu() for name, t in _pairs(weights)}, buf)
    return buf.getvalue()


class WeightsWorkerExtension:
    """The worker side of :func:`load_weights` for multiprocess engines."""

    def vllm_rl_reload_weights(self, payload: bytes) -> int:
        import torch

        state = torch.load(io.BytesIO(payload), weights_only=True)
        self.reload_weights(weights_iterator=list(state.items()))
        return len(state)


def _has_extension(llm: Any) -> bool:
    from vllm.utils.import_utils import resolve_obj_by_qualname

    name = getattr(llm.llm_engine.vllm_config.parallel_config, "worker_extension_cls", "")
    try:
        return bool(name) and issubclass(resolve_obj_by_qualname(name), WeightsWorkerExtension)
    except Exception:                   # noqa: BLE001 - an unknown class has no such method
        return False


def _in_process(llm: Any) -> bool:
    return hasattr(getattr(llm.llm_engine, "model_executor", None), "driver_worker")


def weight_sync(llm: Any, label: str | None = None) -> dict:
    """The cache side of a weight sync on a ``vllm.LLM``: the prefix cache reset, every
    request holding KV recomputed on the new weights, vLLM's weight-version label set
    (``label``, or the RL engine's version).  Returns the engine's report
    (``weight_version``, ``prefix_cache_reset``, ``cached_blocks_dropped``,
    ``requests_recomputed``, ``flagged_samples_across``, ``label``;
    ``patches/engine_core.py``)."""
    client = llm.llm_engine.engine_core
    if hasattr(client, "call_utility"):          # the engine core in its own process
        return client.call_utility("vllm_rl_weight_sync", label)
    return client.engine_core.vllm_rl_weight_sync(label)      # in-process


async def weight_sync_async(engine: Any, label: str | None = None) -> dict:
    """:func:`weight_sync` on an ``AsyncLLM``."""
    return await engine.engine_core.call_utility_async("vllm_rl_weight_sync", label)


def load_weights(llm: Any, weights: Iterable | dict) -> dict:
    """Load new weights in place into a ``vllm.LLM`` (``(name, tensor)`` pairs or a state
    dict, in the checkpoint's names), then :func:`weight_sync` (module docstring); returns
    its report.  A stock ``vllm.LLM`` takes them only in-process
    (``VLLM_ENABLE_V1_MULTIPROCESSING=0``)."""
    pairs = _pairs(weights, engine_dtype(llm))
    if _in_process(llm):
        llm.collective_rpc("reload_weights", kwargs={"weights_iterator": pairs})
    elif _has_extension(llm):
        llm.collective_rpc("vllm_rl_reload_weights", args=(pack(pairs),))
    else:
        raise RuntimeError("load_weights: a multiprocess engine needs vllm_rl's worker "
                           "extension (vllm_rl.LLM has it), or run the engine in-process "
                           "(VLLM_ENABLE_V1_MULTIPROCESSING=0)")
    return weight_sync(llm)


def sync_past(llm: Any, version: int | None, current: int | None) -> int | None:
    """Move a restarted engine's weight version (``current``, from its last
    :func:`weight_sync`) past ``version``, the one a checkpoint's carried samples were
    last sampled under, by syncing again (each a prefix-cache reset, no weights moved): a
    version counts syncs within one engine, and a record's spans must stay ordered across
    a restart.  Returns the engine's version."""
    while version is not None and current is not None and current <= version:
        current = weight_sync(llm)["weight_version"]
    return current


_warned_no_park = False


async def pause_parked(engine: Any, mode: str) -> None:
    """Pause ``engine`` (an ``AsyncLLM``) the way ``pause_generation(mode=mode,
    clear_cache=False)`` does for the requests in flight, with requests that arrive
    during the pause *parked*: queued until ``engine.resume_generation()``, then
    admitted, on vLLM 0.32 and 0.33 alike.

    vLLM 0.32's ``AsyncLLM.pause_generation`` is the engine core's ``pause_scheduler``,
    which queues new requests.  vLLM 0.33's calls the engine core's ``pause_generation``
    instead, which in ``abort`` and ``wait`` mode also rejects every request that
    arrives before the resume (``engine_paused``, a ``RetryableRequestError``: HTTP 503).
    Both versions' engine-core client still has ``pause_scheduler_async`` (vLLM's
    elastic-EP scaling pauses with it), so calling it keeps 0.32's behaviour on both;
    the modes are the same (``abort`` ends the requests in flight, ``wait`` lets them
    finish, ``keep`` freezes them).  :mod:`vllm_rl.compat.contracts` (``reload.*``)
    checks this against a vLLM release.  An engine client without it (not an
    ``AsyncLLM``) is paused with its ``pause_generation``, and a warning says that
    requests arriving meanwhile may be refused.
    """
    global _warned_no_park
    pause = getattr(getattr(engine, "engine_core", None), "pause_scheduler_async", None)
    if pause is not None:
        await pause(mode=mode, clear_cache=False)
        return
    if not _warned_no_park:
        _warned_no_park = True
        import logging

        logging.getLogger(__name__).warning(
            "%s has no engine_core.pause_scheduler_async: pausing with pause_generation, "
            "which may refuse requests that arrive during the reload", type(engine).__name__)
    await engine.pause_generation(mode=mode, clear_cache=False)


async def load_weights_async(engine: Any, weights: Iterable | dict, mode: str = "wait") -> dict:
    """New weights into a serving ``AsyncLLM`` (a vllm_rl engine), between requests.

    ``mode`` decides what happens to requests in flight (vLLM's ``pause_generation``
    modes): ``"wait"`` (the default) lets them finish on the old weights, so every
    sample comes from one policy; ``"abort"`` ends them now with ``finish_reason``
    ``"abort"`` (record reason ``abort``: not a technique's early end); ``"keep"`` freezes
    them and they continue on the new weights, their KV recomputed on them (a partial
    rollout across two policies: its record's ``weight_versions`` says where).  Requests
    that arrive during the reload are parked and then served on the new weights; none is
    refused (:func:`pause_parked`).  Then the reload, :func:`weight_sync_async` (whose
    report this returns), and ``resume_generation``.  The RL state stays.
    """
    if mode not in ("wait", "abort", "keep"):
        raise ValueError(f"load_weights_async mode={mode!r}: allowed 'wait', 'abort', 'keep'")
    dtype = engine.vllm_config.model_config.dtype
    await pause_parked(engine, mode)
    try:
        await engine.collective_rpc("vllm_rl_reload_weights", args=(pack(_pairs(weights, dtype)),))
        return await weight_sync_async(engine)
    finally:
        await engine.resume_generation()
