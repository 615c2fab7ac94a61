"""Hand ARRoL's quality head the hidden states of each step, before they are dropped.

Patched internals: ``vllm.v1.worker.gpu_model_runner.GPUModelRunner.sample_tokens``
(the V1 model runner; ``CPUModelRunner`` subclasses it, so one patch serves both) and
``AsyncGPUModelRunnerOutput.get_output`` (runs the decisions deferred to its wait,
:func:`vllm_rl.step_output.settle`; one dict lookup on any other step).

Why a patch: vLLM keeps a step's final-norm hidden states only between
``execute_model`` (which stores them in ``execute_model_state``) and ``sample_tokens``
(which clears that state); no hook exposes them.  ARRoL scores a sample from the hidden
state of its ``l_detect``-th token in the step that computes it (Alg. 1 l.15-18).  The
wrapper reads ``execute_model_state`` before vLLM's own body and, after it, lets the
runner's scorer (:func:`vllm_rl.arrol.scorer.scorer_of`, made only on ARRoL engines)
put its verdicts in the step's :class:`~vllm_rl.step_output.StepOutput`; it changes nothing else, and on engines
without ARRoL it costs one attribute lookup.

Sync points: the scorer adds no host–device synchronisation to the step.  Its results
come to the host by non-blocking copies started in ``plan`` (before vLLM's body) and are
read only where vLLM itself has waited for the device in that step: after the body with
synchronous output (``_bookkeeping_sync`` → ``GPUModelRunner._to_list``, which records an
event after them on the same stream and synchronises it), and inside the output's
``get_output`` with async output (``AsyncGPUModelRunnerOutput`` records its copy event on
a stream that first waits for the compute stream; ``get_output`` synchronises it).
:func:`check` fails if either wait is gone.  The scorer also reads each sample's token
count from ``num_computed_tokens_cpu`` in ``sample_tokens``: under async speculative
decoding ``execute_model`` ends by taking the last step's rejected drafts off it
(vLLM's deferred correction); :func:`check` fails if it no longer does.

Runner: this is vLLM's **V1** runner.  Model Runner V2 (``vllm/v1/worker/gpu/``) keeps
hidden states elsewhere and is not patched: an ARRoL engine selects V1
(``VLLM_USE_V2_MODEL_RUNNER=0``, set by ``vllm_rl.LLM(arrol=...)``) and its scheduler
refuses to start if the engine would run V2 (:func:`vllm_rl.arrol.config.check_runner`).
"""
from __future__ import annotations

import functools

from .. import CHECKED, Patch, PatchMismatch

_MODULE = "vllm.v1.worker.gpu_model_runner"
TARGET = f"{_MODULE}.GPUModelRunner.sample_tokens"
TARGET_GET = f"{_MODULE}.AsyncGPUModelRunnerOutput.get_output"
_EXPECTED_PARAMS = ("self", "grammar_output")
_STATE_FIELDS = ("scheduler_output", "hidden_states")


def _target():
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    return GPUModelRunner


def _check(source=None) -> None:
    """Fail loudly if vLLM no longer has the shape this patch relies on: the installed
    vLLM, or ``source`` (a :class:`~vllm_rl.compat.source.SourceTree` of any release)."""
    import ast

    from vllm_rl.compat.source import assignments, is_attr

    from .. import source_of, target_method

    src = source_of(source)
    fn, where = target_method(src, _MODULE, "GPUModelRunner", "sample_tokens", TARGET,
                              CHECKED, _EXPECTED_PARAMS)
    missing = [f for f in _STATE_FIELDS if f not in src.fields(_MODULE, "ExecuteModelState")]
    if missing:
        raise PatchMismatch(f"ExecuteModelState has no {missing} {where}")
    cleared = [a for a in assignments(fn.node, "self.execute_model_state")
               if isinstance(a.value, ast.Constant) and a.value.value is None]
    read = [n for n in ast.walk(fn.node) if is_attr(n, "self", "execute_model_state")
            and isinstance(n.ctx, ast.Load)]
    if not cleared or not read or min(n.lineno for n in read) > cleared[0].lineno:
        raise PatchMismatch(f"{TARGET} no longer consumes execute_model_state {where}")
    # the scorer reads its non-blocking copies after these waits (vllm_rl.arrol.scorer)
    from vllm_rl.compat.source import SourceMissing, calls

    try:
        to_list = src.method(_MODULE, "GPUModelRunner", "_to_list").node
        get = src.method(_MODULE, "AsyncGPUModelRunnerOutput", "get_output").node
        if ast.unparse(get.body[-1]) != "return output":
            raise PatchMismatch(f"{TARGET_GET} no longer ends returning its output "
                                f"(its ModelRunnerOutput) {where}")
        init = src.method(_MODULE, "AsyncGPUModelRunnerOutput", "__init__").node
        execute = src.method(_MODULE, "GPUModelRunner", "execute_model").node
    except SourceMissing as e:
        raise PatchMismatch(f"{e} is gone: the scorer's sync points cannot be told {where}")
    if not calls(to_list, "synchronize") or not calls(get, "synchronize",
                                                       "self.async_copy_ready_event") \
            or not calls(init, "wait_stream"):
        raise PatchMismatch(f"vLLM no longer waits for the device in _to_list / "
                            f"AsyncGPUModelRunnerOutput.get_output: the ARRoL scorer's "
                            f"copies would be read unfinished {where}")
    # the scorer reads a sample's token count from num_computed_tokens_cpu in
    # sample_tokens: execute_model must have taken the last step's rejected drafts off it
    # (async speculative decoding's deferred correction) before it returns
    tail = [ast.unparse(stmt) for stmt in execute.body[-2:]]
    if len(tail) < 2 or not tail[-1].startswith("return") \
            or "deferred_state_corrections_fn()" not in tail[0]:
        raise PatchMismatch(f"GPUModelRunner.execute_model no longer ends with its deferred "
                            f"token-count corrections: the ARRoL scorer would read counts "
                            f"that still hold rejected drafts {where}")
    cpu = "vllm.v1.worker.cpu_model_runner"
    if not src.is_subclass(cpu, "CPUModelRunner", _MODULE, "GPUModelRunner"):
        raise PatchMismatch(f"CPUModelRunner no longer subclasses GPUModelRunner {where}")
    owner = src.method(cpu, "CPUModelRunner", "sample_tokens").owner
    if not owner.endswith(".GPUModelRunner"):
        raise PatchMismatch(f"{owner} overrides {TARGET} {where}")
    # check_runner tells V1 from Model Runner V2 by this property (set from the env var).
    if "use_v2_model_runner" not in src.fields("vllm.config.vllm", "VllmConfig") \
            or "VLLM_USE_V2_MODEL_RUNNER" not in src.text("vllm.envs"):
        raise PatchMismatch(f"VllmConfig.use_v2_model_runner (VLLM_USE_V2_MODEL_RUNNER) is "
                            f"gone: the V1 runner this patch serves cannot be told {where}")


def _apply() -> None:
    from vllm.v1.worker.gpu_model_runner import AsyncGPUModelRunnerOutput

    from vllm_rl.arrol.scorer import RUNNER_ATTR, scorer_of
    from vllm_rl.step_output import settle

    cls = _target()
    original = cls.sample_tokens

    @functools.wraps(original)
    def sample_tokens(self, grammar_output, *args, **kwargs):
        scorer = self.__dict__[RUNNER_ATTR] if RUNNER_ATTR in self.__dict__ \
            else scorer_of(self)
        if scorer is None:
            return original(self, grammar_output, *args, **kwargs)
        state = self.execute_model_state
        plan = scorer.plan(self, state) if state is not None else None
        out = original(self, grammar_output, *args, **kwargs)
        if plan:
            scorer.finish(plan, out)
        return out

    get = AsyncGPUModelRunnerOutput.get_output

    @functools.wraps(get)
    def get_output(self, *args, **kwargs):
        out = get(self, *args, **kwargs)
        settle(out)
        return out

    cls.sample_tokens = sample_tokens
    AsyncGPUModelRunnerOutput.get_output = get_output


class ArrolCapture(Patch, check=_check, apply=_apply):
    """The quality head's rows captured before vLLM drops them (module docstring)."""

    targets = (TARGET, TARGET_GET)
