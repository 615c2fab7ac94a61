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

from . import PatchMismatch

_MODULE = "vllm.v1.engine.output_processor"
TARGET = f"{_MODULE}.RequestState.make_request_output"
ADD_TARGET = f"{_MODULE}.OutputProcessor.add_request"
CHECKED = ("0.32.0", "0.33.0")
_EXPECTED_PARAMS = ("self", "new_token_ids", "pooling_output", "finish_reason", "stop_reason")
_ADD_PARAMS = ("self", "request", "prompt")
_STATE_FIELDS = ("max_tokens_param", "detokenizer")


def _targets():
    from vllm.v1.engine.output_processor import OutputProcessor, RequestState

    return RequestState, OutputProcessor


def check(source=None) -> None:
    """Fail loudly if vLLM no longer has the shape this patch relies on: the installed
    vLLM, or ``source`` (a :class:`~vllm_rl.compat.source.SourceTree` of any release)."""
    import ast

    from vllm_rl.compat.source import SourceMissing, calls, self_attrs_assigned

    from . import source_of, target_method

    src = source_of(source)
    _, where = target_method(src, _MODULE, "RequestState", "make_request_output", TARGET,
                             CHECKED, _EXPECTED_PARAMS)
    add, _ = target_method(src, _MODULE, "OutputProcessor", "add_request", ADD_TARGET,
                           CHECKED, _ADD_PARAMS)
    init = src.method(_MODULE, "RequestState", "__init__").node
    missing = [f for f in _STATE_FIELDS if f not in self_attrs_assigned(init)]
    if missing:
        raise PatchMismatch(f"RequestState no longer keeps {missing} {where}")
    # Outputs end in process_outputs, client aborts in abort_requests: both make outputs.
    for name in ("process_outputs", "abort_requests"):
        try:
            body = src.method(_MODULE, "OutputProcessor", name).node
        except SourceMissing:
            body = None
        if body is None or not calls(body, "make_request_output"):
            raise PatchMismatch(f"{TARGET} is no longer where outputs and aborts end "
                                f"(OutputProcessor.{name}) {where}")
    stored = [n for n in ast.walk(add.node) if isinstance(n, ast.Assign) and any(
        isinstance(t, ast.Subscript) and ast.unparse(t.value) == "self.request_states"
        for t in n.targets)]
    if not stored:
        raise PatchMismatch(f"{ADD_TARGET} no longer stores the request's state in "
                            f"self.request_states {where}")


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
