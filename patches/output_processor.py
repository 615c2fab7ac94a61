"""Take each flagged sample's record out of ``stop_reason`` into its own field, and count
it on ``/metrics``, as its final output passes the front end.

Patched internals: ``vllm.v1.engine.output_processor.RequestState._new_completion_output``
(every ``CompletionOutput`` a request gets, final ones included: the engine's, the front
end's own stop-string ends, and the client aborts of ``AsyncLLM``) and
``OutputProcessor.add_request`` (marks the state of a request that carries flags).

Why a patch: the record crosses the engine core's process boundary in the finished
request's ``stop_reason`` (the one field vLLM carries from the scheduler to the front
end; :mod:`vllm_rl.outcome`).  Before vLLM builds the client's ``CompletionOutput``,
the wrapper takes the record out: the output gets vLLM's own ``stop_reason`` (the stop
string or token that ended it, kept in the record's ``stop``) and the record as
``CompletionOutput.rollout_info`` (the OpenAI server's choices carry it as
``rollout_info``: ``patches/openai_serving.py``).  No client sees the carrier.  vLLM's
stat loggers cannot count the records: they see per finished request a
``FinishedRequestStats`` without ``stop_reason``, a ``SchedulerStats`` subclass loses its
extra fields on the way from the engine core (msgspec), and stat-logger plugins are
loaded by ``AsyncLLM`` only; so the same wrapper counts each final output
(:func:`vllm_rl.metrics.observe_output`).  An unfinished output costs one comparison.
"""
from __future__ import annotations

import functools

from . import CHECKED, Patch, PatchMismatch

_MODULE = "vllm.v1.engine.output_processor"
TARGET = f"{_MODULE}.RequestState._new_completion_output"
ADD_TARGET = f"{_MODULE}.OutputProcessor.add_request"
_EXPECTED_PARAMS = ("self", "token_ids", "finish_reason", "stop_reason")
_ADD_PARAMS = ("self", "request", "prompt")
_STATE_FIELDS = ("max_tokens_param", "detokenizer")


def _targets():
    from vllm.v1.engine.output_processor import OutputProcessor, RequestState

    return RequestState, OutputProcessor


def _check(source=None) -> None:
    """Fail loudly if vLLM no longer has the shape this patch relies on: the installed
    vLLM, or ``source`` (a :class:`~vllm_rl.compat.source.SourceTree` of any release)."""
    import ast

    from vllm_rl.compat.source import SourceMissing, calls, self_attrs_assigned

    from . import source_of, target_method

    src = source_of(source)
    new, where = target_method(src, _MODULE, "RequestState", "_new_completion_output",
                               TARGET, CHECKED, _EXPECTED_PARAMS)
    if "stop_reason=stop_reason if finished else None" not in ast.unparse(new.node):
        raise PatchMismatch(f"{TARGET} no longer gives the output its stop_reason "
                            f"(stop_reason=stop_reason if finished) {where}")
    make = src.method(_MODULE, "RequestState", "make_request_output").node
    if not calls(make, "_new_completion_output", receiver="self"):
        raise PatchMismatch(f"RequestState.make_request_output no longer builds its "
                            f"completion with self._new_completion_output {where}")
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
            raise PatchMismatch(f"make_request_output is no longer where outputs and "
                                f"aborts end "
                                f"(OutputProcessor.{name}) {where}")
    stored = [n for n in ast.walk(add.node) if isinstance(n, ast.Assign) and any(
        isinstance(t, ast.Subscript) and ast.unparse(t.value) == "self.request_states"
        for t in n.targets)]
    if not stored:
        raise PatchMismatch(f"{ADD_TARGET} no longer stores the request's state in "
                            f"self.request_states {where}")


def _apply() -> None:
    from vllm_rl.flags import KEY
    from vllm_rl.metrics import counters, observe_output
    from vllm_rl.outcome import RECORD_FIELD, RolloutInfo

    counters()                       # the series exist (at 0) from the start
    state_cls, proc_cls = _targets()
    original = state_cls._new_completion_output

    @functools.wraps(original)
    def _new_completion_output(self, token_ids, finish_reason, stop_reason, *args, **kwargs):
        if finish_reason is None:
            return original(self, token_ids, finish_reason, stop_reason, *args, **kwargs)
        info = RolloutInfo.decode(stop_reason)
        if info is not None:             # the carrier out, vLLM's own stop_reason back
            stop_reason = info.stop
        out = original(self, token_ids, finish_reason, stop_reason, *args, **kwargs)
        if info is not None:
            setattr(out, RECORD_FIELD, info)
        observe_output(self, finish_reason, stop_reason, info)
        return out

    add = proc_cls.add_request
    dotted = KEY + "."

    @functools.wraps(add)
    def add_request(self, request, prompt, *args, **kwargs):
        add(self, request, prompt, *args, **kwargs)
        extra = request.sampling_params.extra_args if request.sampling_params else None
        if extra and (KEY in extra or any(k.startswith(dotted) for k in extra)):
            self.request_states[request.request_id].vllm_rl_flagged = True

    state_cls._new_completion_output = _new_completion_output
    proc_cls.add_request = add_request


class RecordField(Patch, check=_check, apply=_apply):
    """Records in their own field, counted on ``/metrics`` (module docstring)."""

    targets = (TARGET, ADD_TARGET)
