"""Count every vllm_rl sample on ``/metrics`` as its final output passes the front end.

Patched internals: ``vllm.v1.engine.output_processor.RequestState.make_request_output``
(every output of a request, final ones included: the engine's, the front end's own stop
string ends, and the client aborts of ``AsyncLLM``) and ``OutputProcessor.add_request``
(marks the state of a request that carries flags).

Why a patch: the per-sample record (:class:`~vllm_rl.outcome.RolloutInfo`, in the
output's ``stop_reason``) reaches the front end only with the output.  vLLM's stat
loggers see per finished request a ``FinishedRequestStats`` without ``stop_reason``, a
``SchedulerStats`` subclass loses its extra fields on the way from the engine core
(msgspec), and stat-logger plugins are loaded by ``AsyncLLM`` only.  The wrapper reads
the record of a finished output (:func:`vllm_rl.metrics.observe_output`) and changes
nothing; an unfinished output costs one comparison.
"""
from __future__ import annotations

import functools
import inspect

from . import PatchMismatch, checked_target

TARGET = "vllm.v1.engine.output_processor.RequestState.make_request_output"
ADD_TARGET = "vllm.v1.engine.output_processor.OutputProcessor.add_request"
CHECKED = ("0.32.0",)
_EXPECTED_PARAMS = ("self", "new_token_ids", "pooling_output", "finish_reason", "stop_reason")
_ADD_PARAMS = ("self", "request", "prompt")
_STATE_FIELDS = ("max_tokens_param", "detokenizer")


def _targets():
    from vllm.v1.engine.output_processor import OutputProcessor, RequestState

    return RequestState, OutputProcessor


def check() -> None:
    """Fail loudly if vLLM no longer has the shape this patch relies on."""
    state_cls, proc_cls = _targets()
    fn, where = checked_target(state_cls, "make_request_output", TARGET, CHECKED,
                               _EXPECTED_PARAMS)
    checked_target(proc_cls, "add_request", ADD_TARGET, CHECKED, _ADD_PARAMS)
    init = inspect.getsource(state_cls.__init__)
    missing = [f for f in _STATE_FIELDS if f"self.{f} =" not in init]
    if missing:
        raise PatchMismatch(f"RequestState no longer keeps {missing} {where}")
    source = inspect.getsource(proc_cls)
    if (source.count("make_request_output(") < 2
            or "self.request_states[request_id] =" not in source):
        raise PatchMismatch(f"{TARGET} is no longer where outputs and aborts end {where}")


def apply() -> None:
    from vllm_rl.flags import KEY
    from vllm_rl.metrics import counters, observe_output

    counters()                       # the series exist (at 0) from the start
    state_cls, proc_cls = _targets()
    original = state_cls.make_request_output
    if not getattr(original, "_vllm_rl_patched", False):
        @functools.wraps(original)
        def make_request_output(self, new_token_ids, pooling_output, finish_reason,
                                stop_reason, *args, **kwargs):
            if finish_reason is not None:
                observe_output(self, finish_reason, stop_reason)
            return original(self, new_token_ids, pooling_output, finish_reason,
                            stop_reason, *args, **kwargs)

        make_request_output._vllm_rl_patched = True
        state_cls.make_request_output = make_request_output

    add = proc_cls.add_request
    if not getattr(add, "_vllm_rl_patched", False):
        dotted = KEY + "."

        @functools.wraps(add)
        def add_request(self, request, prompt, *args, **kwargs):
            add(self, request, prompt, *args, **kwargs)
            extra = request.sampling_params.extra_args if request.sampling_params else None
            if extra and (KEY in extra or any(k.startswith(dotted) for k in extra)):
                self.request_states[request.request_id].vllm_rl_flagged = True

        add_request._vllm_rl_patched = True
        proc_cls.add_request = add_request
