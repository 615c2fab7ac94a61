"""The RL engine's two engine-core calls: a weight sync that says what it did, and the
end of a trainer step.

Patched internal: ``vllm.v1.engine.core.EngineCore`` gains two utility methods,
``vllm_rl_weight_sync`` and ``vllm_rl_end_step`` (nothing of vLLM's is replaced).  The engine-core clients call
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

``vllm_rl_end_step(step)``: partial rollouts on several engines (verl's replicas,
OpenRLHF's actors), where only the drop-in sees every group of a step: once its rule
holds it ends the step on each engine (the scheduler's ``rl_end_step``; the samples
still generating are carried at the engine's next step).  No vLLM path reaches the
scheduler from a client but a utility.
"""
from __future__ import annotations

from . import CHECKED, Patch, PatchMismatch

_MODULE = "vllm.v1.engine.core"
TARGET = f"{_MODULE}.EngineCore.vllm_rl_weight_sync"
END_STEP = f"{_MODULE}.EngineCore.vllm_rl_end_step"
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


def vllm_rl_end_step(self, step: int) -> int:
    """End trainer step ``step`` on this engine now; how many of its samples it carries
    (0: none live).  An engine without the RL scheduler refuses."""
    end = getattr(self.scheduler, "rl_end_step", None)
    if end is None:
        raise RuntimeError("vllm_rl_end_step: this engine does not run the RL scheduler "
                           "(vllm_rl.settings.EngineSettings)")
    return end(step)


def _apply() -> None:
    cls = _target()
    if getattr(cls, "vllm_rl_weight_sync", None) is None:
        cls.vllm_rl_weight_sync = vllm_rl_weight_sync
    if getattr(cls, "vllm_rl_end_step", None) is None:
        cls.vllm_rl_end_step = vllm_rl_end_step


class EngineCoreCalls(Patch, check=_check, apply=_apply):
    """``EngineCore.vllm_rl_weight_sync`` and ``EngineCore.vllm_rl_end_step`` added
    (module docstring)."""

    targets = (TARGET, END_STEP)
