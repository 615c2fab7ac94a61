"""What the RL worker adds to a step's ``ModelRunnerOutput``: one typed record.

The worker's techniques tell the scheduler three things per step, each from the step
that computed it:

* ARRoL's verdicts at ``l_detect`` (Alg. 1 l.15-19; App. A.4, Eq. 1-2), by request id
  (:class:`vllm_rl.arrol.rule.ArrolVerdict`; :mod:`vllm_rl.arrol.scorer`);
* DAS's draft counts under async scheduling: how many draft tokens each request was
  verified on (the scheduler saw only placeholders; :func:`vllm_rl.das.engine.count_drafts`);
* whether DAS's drafter drafts after this step, and for which requests when they are
  few (the scheduler gives placeholder drafts only to the samples it drafts for).

They travel as one :class:`StepOutput` in the output's ``vllm_rl`` attribute
(:data:`ATTR`), pickled with it across vLLM's multiprocess executor; the worker writes
it with :func:`attach`, the scheduler reads it with :func:`of`.  An engine without the
techniques never makes one: :func:`of` is one dict lookup.

A decision that needs the step's host copies under vLLM's async output waits for
``AsyncGPUModelRunnerOutput.get_output``, vLLM's own wait: it is queued with
:meth:`StepOutput.defer` and run there (``patches/model_runner/arrol_capture.py``), and
never crosses a process boundary.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

ATTR = "vllm_rl"


@dataclass
class StepOutput:
    """The RL worker's part of one step's output (module docstring)."""

    verdicts: dict[str, Any] = field(default_factory=dict)    # ARRoL: ArrolVerdict by id
    drafts: dict[str, int] | None = None     # DAS: draft tokens verified, by request id
    drafting: bool | None = None             # DAS: the drafter drafts after this step
    drafts_for: frozenset[str] | None = None  # ... for these requests only (None: all)
    deferred: list[Callable[[Any], None]] = field(default_factory=list, repr=False)

    def defer(self, decide: Callable[[Any], None]) -> None:
        """Run ``decide(model_runner_output)`` once vLLM's async output has waited for
        its copies (:func:`settle`)."""
        self.deferred.append(decide)

    def __getstate__(self) -> dict:
        if self.deferred:
            raise RuntimeError("a StepOutput crossed a process with decisions unsettled")
        return {k: v for k, v in self.__dict__.items() if k != "deferred"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, deferred=[])


def of(output: Any) -> StepOutput | None:
    """The scheduler's side: the step's :class:`StepOutput`, or None."""
    found = getattr(output, "__dict__", None)
    return None if found is None else found.get(ATTR)


def attach(output: Any) -> StepOutput:
    """The worker's side: the :class:`StepOutput` of ``output`` (a ``ModelRunnerOutput``
    or vLLM's async wrapper of one), made on first use."""
    mro = getattr(output, "_model_runner_output", output)
    step = mro.__dict__.get(ATTR)
    if step is None:
        step = mro.__dict__[ATTR] = StepOutput()
    return step


def settle(mro: Any) -> None:
    """Run the decisions deferred to vLLM's wait in ``get_output``, in order."""
    step = mro.__dict__.get(ATTR)
    if step is not None and step.deferred:
        deferred, step.deferred = step.deferred, []
        for decide in deferred:
            decide(mro)


__all__ = ["ATTR", "StepOutput", "attach", "of", "settle"]
