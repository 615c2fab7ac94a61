"""Hand ARRoL's quality head the hidden states of each step, before they are dropped.

Patched internal: ``vllm.v1.worker.gpu_model_runner.GPUModelRunner.sample_tokens``
(the V1 model runner; ``CPUModelRunner`` subclasses it, so one patch serves both).

Why a patch: vLLM keeps a step's final-norm hidden states only between
``execute_model`` (which stores them in ``execute_model_state``) and ``sample_tokens``
(which clears that state); no hook exposes them.  ARRoL scores a sample from the hidden
state of its ``l_detect``-th token in the step that computes it (Alg. 1 l.15-18).  The
wrapper reads ``execute_model_state`` before vLLM's own body and, after it, lets the
runner's scorer (``runner.vllm_rl_arrol``, set only on ARRoL engines) attach its
verdicts to the step's ``ModelRunnerOutput``; it changes nothing else, and on engines
without ARRoL it costs one attribute lookup.

Runner: this is vLLM's **V1** runner.  Model Runner V2 (``vllm/v1/worker/gpu/``) keeps
hidden states elsewhere and is not patched: an ARRoL engine selects V1
(``VLLM_USE_V2_MODEL_RUNNER=0``, set by ``vllm_rl.LLM(arrol=...)``) and its scheduler
refuses to start if the engine would run V2 (:func:`vllm_rl.arrol.config.check_runner`).
"""
from __future__ import annotations

import functools
import inspect

from . import PatchMismatch, checked_target

TARGET = "vllm.v1.worker.gpu_model_runner.GPUModelRunner.sample_tokens"
CHECKED = ("0.32.0",)
_EXPECTED_PARAMS = ("self", "grammar_output")
_STATE_FIELDS = ("scheduler_output", "hidden_states")
_UNSET = object()


def _target():
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    return GPUModelRunner


def check() -> None:
    """Fail loudly if vLLM no longer has the shape this patch relies on."""
    fn, where = checked_target(_target(), "sample_tokens", TARGET, CHECKED, _EXPECTED_PARAMS)
    from vllm.v1.worker.gpu_model_runner import ExecuteModelState

    missing = [f for f in _STATE_FIELDS if f not in ExecuteModelState._fields]
    if missing:
        raise PatchMismatch(f"ExecuteModelState has no {missing} {where}")
    if "self.execute_model_state = None" not in inspect.getsource(fn):
        raise PatchMismatch(f"{TARGET} no longer consumes execute_model_state {where}")
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner

    if not issubclass(CPUModelRunner, _target()):
        raise PatchMismatch(f"CPUModelRunner no longer subclasses GPUModelRunner {where}")


def apply() -> None:
    cls = _target()
    original = cls.sample_tokens
    if getattr(original, "_vllm_rl_patched", False):
        return

    @functools.wraps(original)
    def sample_tokens(self, grammar_output, *args, **kwargs):
        scorer = self.__dict__.get("vllm_rl_arrol", _UNSET)
        if scorer is _UNSET:
            from vllm_rl.arrol.scorer import scorer_of

            scorer = scorer_of(self)
        if scorer is None:
            return original(self, grammar_output, *args, **kwargs)
        state = self.execute_model_state
        plan = scorer.plan(self, state) if state is not None else None
        out = original(self, grammar_output, *args, **kwargs)
        if plan:
            scorer.finish(plan, out)
        return out

    sample_tokens._vllm_rl_patched = True
    cls.sample_tokens = sample_tokens

