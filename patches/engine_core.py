"""A weight sync's cache side as one engine-core call that says what it did.

Patched internal: ``vllm.v1.engine.core.EngineCore`` gains one utility method,
``vllm_rl_weight_sync`` (nothing of vLLM's is replaced).  The engine-core clients call
utilities by name (``call_utility`` / ``call_utility_async``: ``getattr(engine_core,
name)``), so the reload paths of :mod:`vllm_rl.weights` and the server's
``/vllm_rl/reload_weights`` reach it like vLLM's own ``reset_prefix_cache``.

Why a patch: vLLM's ``reset_prefix_cache`` answers a bool, and the scheduler, which
knows what the reset did (requests recomputed, cached blocks dropped, the RL weight
version: ``RLSchedulerMixin.reset_prefix_cache``), has no other way to the client.  The
method resets the prefix cache with the requests in flight recomputed (vLLM's own
``reset_running_requests``, as its ``pause_generation(clear_cache=True)`` does), sets
vLLM's weight-version label (``set_weight_version``: ``CompletionOutput.weight_versions``
then marks the tokens of each version) and returns the scheduler's report.
"""
from __future__ import annotations

from . import CHECKED, Patch, PatchMismatch

_MODULE = "vllm.v1.engine.core"
TARGET = f"{_MODULE}.EngineCore.vllm_rl_weight_sync"
_RESET = ("self", "reset_running_requests", "reset_connector")
_LABEL = ("self", "weight_version")


def _target():
    from vllm.v1.engine.core import EngineCore

    return EngineCore


def _check(source=None) -> None:
    """Fail loudly if vLLM no longer has what the method calls: the installed vLLM, or
    ``source`` (a :class:`~vllm_rl.compat.source.SourceTree` of any release)."""
    from vllm_rl.compat.source import self_attrs_assigned

    from . import source_of, target_method

    src = source_of(source)
    _, where = target_method(src, _MODULE, "EngineCore", "reset_prefix_cache",
                             f"{_MODULE}.EngineCore.reset_prefix_cache", CHECKED, _RESET)
    target_method(src, _MODULE, "EngineCore", "set_weight_version",
                  f"{_MODULE}.EngineCore.set_weight_version", CHECKED, _LABEL)
    target_method(src, "vllm.v1.core.sched.scheduler", "Scheduler", "reset_prefix_cache",
                  "vllm.v1.core.sched.scheduler.Scheduler.reset_prefix_cache", CHECKED, _RESET)
    init = src.method(_MODULE, "EngineCore", "__init__").node
    if "scheduler" not in self_attrs_assigned(init):
        raise PatchMismatch(f"EngineCore no longer keeps self.scheduler {where}")


def vllm_rl_weight_sync(self, label: str | None = None) -> dict:
    """Reset the prefix cache for new weights, requests in flight recomputed on them;
    label the weights (``label``, or the RL scheduler's version); say what happened."""
    sched = self.scheduler
    running = sum(1 for r in sched.running if r.num_computed_tokens > 0)
    ok = self.reset_prefix_cache(reset_running_requests=True)
    report = dict(getattr(sched, "rl_last_sync", None) or {}) if hasattr(
        sched, "rl_weight_version") else {"weight_version": None, "prefix_cache_reset": ok,
                                          "requests_recomputed": running}
    if label is None and report.get("weight_version") is not None:
        label = str(report["weight_version"])
    if label is not None:
        self.set_weight_version(label)
    report["label"] = label
    return report


def _apply() -> None:
    cls = _target()
    if getattr(cls, "vllm_rl_weight_sync", None) is None:
        cls.vllm_rl_weight_sync = vllm_rl_weight_sync


class WeightSync(Patch, check=_check, apply=_apply):
    """``EngineCore.vllm_rl_weight_sync`` added (module docstring)."""

    targets = (TARGET,)
