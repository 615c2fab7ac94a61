"""Run the DAS drafter under vLLM's asynchronous scheduling: it drafts between steps.

Patched internals (checked on 0.32.0 and 0.33.0; the config that lets a DAS engine
schedule asynchronously is ``patches/config.py``):

* ``GPUModelRunner._bookkeeping_sync``: first, a drafter with ``after_sample`` gets
  the step's sampled ids on the device (under async speculative decoding vLLM's
  bookkeeping expects the drafter to have set each row's last token and count,
  ``_copy_valid_sampled_token_count``, as EAGLE's and ngram_gpu's do before it).
* ``GPUModelRunner.execute_model``: before vLLM's body, a drafter with ``before_step``
  (DAS's, :meth:`vllm_rl.das.drafter.DASProposer.before_step`) makes the drafts of the
  step that ran and gives the scheduler output as the worker runs it, each request's
  placeholder drafts cut to its real ones; after it, each cut request's
  ``prev_num_draft_len`` is the scheduler's count again (vLLM's ngram_gpu path does
  the same in ``_update_states``: the scheduler's optimistic token counts assumed every
  placeholder).
* ``GPUModelRunner._model_forward`` (measurement only): in a step whose drafter waited
  for the device, vLLM's input preparation from the drafter's return to the forward pass
  is host time on the step's path; it is added to the path counter
  (:data:`vllm_rl.cost.host.WORKER`) and handed to the drafter for its cost cap.
* ``GPUModelRunner.sample_tokens`` (outside ARRoL's wrapper, ``after``): the step's
  :class:`~vllm_rl.step_output.StepOutput` carries the draft tokens each request was
  verified on (``drafts``): the scheduler only saw placeholders, and the records count
  real drafts (:func:`vllm_rl.das.engine.count_drafts`), and whether the drafter's last
  decision drafts (``drafting``): the scheduler gives DAS samples placeholder drafts
  only while it does.

How it overlaps: vLLM's async engine schedules step n + 1 and processes step n - 1's
output while step n runs.  With DAS's lookahead (the default) the drafter drafts step
n + 1 at the start of its ``execute_model`` from a guess of step n's outcome, waiting for
nothing; without it (``DASConfig.lookahead=False``) it waits there for step n's tokens,
as vLLM's own ``ngram_gpu`` waits for its draft counts, and that wait and the drafting
after it are host time on the step's path (``docs/ARCHITECTURE.md``, "DAS under async
scheduling").
"""
from __future__ import annotations

import functools
from time import perf_counter_ns

from .. import Patch, PatchMismatch

TARGET_BOOKKEEPING = "vllm.v1.worker.gpu_model_runner.GPUModelRunner._bookkeeping_sync"
TARGET_EXECUTE = "vllm.v1.worker.gpu_model_runner.GPUModelRunner.execute_model"
TARGET_SAMPLE = "vllm.v1.worker.gpu_model_runner.GPUModelRunner.sample_tokens"
TARGET_FORWARD = "vllm.v1.worker.gpu_model_runner.GPUModelRunner._model_forward"
_RUNNER = "vllm.v1.worker.gpu_model_runner"
_RUNNER_FIELDS = ("_draft_token_ids", "prev_num_spec_tokens", "discard_request_mask",
                  "_draft_token_req_ids", "use_async_scheduling", "requests")


def _check(source=None) -> None:
    """Fail loudly if vLLM no longer has the shape this patch relies on: the installed
    vLLM, or ``source`` (a :class:`~vllm_rl.compat.source.SourceTree` of any release)."""
    import ast

    from vllm_rl.compat.source import calls

    from .. import CHECKED, source_of, target_method

    src = source_of(source)
    book, where = target_method(src, _RUNNER, "GPUModelRunner", "_bookkeeping_sync",
                            TARGET_BOOKKEEPING, CHECKED,
                            ("self", "scheduler_output", "sampler_output"))
    if "prev_sampled_token_ids is None" not in ast.unparse(book.node):
        raise PatchMismatch(f"{TARGET_BOOKKEEPING} no longer reads the previous tokens the "
                            f"drafter set under async speculative decoding {where}")
    execute, _ = target_method(src, _RUNNER, "GPUModelRunner", "execute_model",
                               TARGET_EXECUTE, CHECKED, ("self", "scheduler_output"))
    if not calls(execute.node, "_update_states", receiver="self"):
        raise PatchMismatch(f"{TARGET_EXECUTE} no longer updates the batch "
                            f"(self._update_states) {where}")
    if not calls(execute.node, "_model_forward", receiver="self"):
        raise PatchMismatch(f"{TARGET_EXECUTE} no longer runs the model through "
                            f"self._model_forward {where}")
    target_method(src, _RUNNER, "GPUModelRunner", "_model_forward", TARGET_FORWARD, CHECKED,
                  ("self",))
    target_method(src, _RUNNER, "GPUModelRunner", "sample_tokens", TARGET_SAMPLE, CHECKED,
                  ("self", "grammar_output"))
    for name in ("_copy_valid_sampled_token_count", "_copy_draft_token_ids_to_cpu",
                 "_prepare_input_ids", "_update_states"):
        target_method(src, _RUNNER, "GPUModelRunner", name,
                      f"{_RUNNER}.GPUModelRunner.{name}", CHECKED, ("self",))
    prep = ast.unparse(src.method(_RUNNER, "GPUModelRunner", "_prepare_input_ids").node)
    if "self._draft_token_ids" not in prep or "self.prev_num_spec_tokens" not in prep:
        raise PatchMismatch(f"GPUModelRunner._prepare_input_ids no longer scatters "
                            f"self._draft_token_ids by self.prev_num_spec_tokens {where}")
    init = ast.unparse(src.method(_RUNNER, "GPUModelRunner", "__init__").node)
    missing = [f for f in _RUNNER_FIELDS if f"self.{f}" not in init]
    if missing:
        raise PatchMismatch(f"GPUModelRunner no longer sets {missing} {where}")
    states = ast.unparse(src.method(_RUNNER, "GPUModelRunner", "_update_states").node)
    if "prev_num_draft_len" not in states:
        raise PatchMismatch(f"GPUModelRunner._update_states no longer corrects async "
                            f"drafts by prev_num_draft_len {where}")
    after = ast.unparse(src.method("vllm.v1.core.sched.async_scheduler", "AsyncScheduler",
                                   "_update_after_schedule").node)
    if "num_output_placeholders" not in after or "num_spec_tokens_to_schedule" not in after:
        raise PatchMismatch(f"AsyncScheduler no longer schedules num_spec_tokens_to_schedule "
                            f"placeholder drafts (RLScheduler._update_after_schedule) {where}")


def _apply() -> None:
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    bookkeeping = GPUModelRunner._bookkeeping_sync
    execute = GPUModelRunner.execute_model
    sample_tokens = GPUModelRunner.sample_tokens
    forward = GPUModelRunner._model_forward
    from vllm_rl.cost.host import WORKER
    from vllm_rl.das.async_drafts import PATH_ATTR, PREP_ATTR
    from vllm_rl.step_output import attach

    @functools.wraps(bookkeeping)
    def _bookkeeping_sync(self, scheduler_output, sampler_output, *args, **kwargs):
        after = getattr(getattr(self, "drafter", None), "after_sample", None)
        if after is not None and self.use_async_scheduling:
            after(self, sampler_output.sampled_token_ids)
        return bookkeeping(self, scheduler_output, sampler_output, *args, **kwargs)

    @functools.wraps(execute)
    def execute_model(self, scheduler_output, *args, **kwargs):
        before = getattr(getattr(self, "drafter", None), "before_step", None)
        if before is None or not self.use_async_scheduling:
            return execute(self, scheduler_output, *args, **kwargs)
        scheduler_output, cut, drafts = before(self, scheduler_output)
        self._vllm_rl_drafts = drafts
        try:
            return execute(self, scheduler_output, *args, **kwargs)
        finally:
            for rid, scheduled in cut.items():
                state = self.requests.get(rid)
                if state is not None:
                    state.prev_num_draft_len = scheduled

    @functools.wraps(sample_tokens)
    def sample_tokens_(self, *args, **kwargs):
        out = sample_tokens(self, *args, **kwargs)
        drafts = self.__dict__.pop("_vllm_rl_drafts", None)
        drafter = getattr(self, "drafter", None)
        if out is not None and self.use_async_scheduling and hasattr(drafter, "before_step"):
            step = attach(out)
            step.drafts = drafts
            step.drafting = drafter.drafting
            step.drafts_for = drafter.drafts_for
        return out

    @functools.wraps(forward)
    def _model_forward(self, *args, **kwargs):
        mark = self.__dict__.pop(PATH_ATTR, None)
        if mark is not None:            # a drafting step: vLLM's preparation on the path
            prep = perf_counter_ns() - mark
            WORKER.path_ns += prep
            self.__dict__[PREP_ATTR] = prep
        return forward(self, *args, **kwargs)

    GPUModelRunner._model_forward = _model_forward
    GPUModelRunner.sample_tokens = sample_tokens_
    GPUModelRunner._bookkeeping_sync = _bookkeeping_sync
    GPUModelRunner.execute_model = execute_model


class DasAsyncRunner(Patch, check=_check, apply=_apply):
    """The DAS drafter drafting between steps under async scheduling (module docstring)."""

    targets = (TARGET_BOOKKEEPING, TARGET_EXECUTE, TARGET_SAMPLE, TARGET_FORWARD)
    after = ("ArrolCapture",)          # its sample_tokens wrapper runs outside ARRoL's
