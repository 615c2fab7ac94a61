"""ARRoL in the engine: a scored sample's verdict, and ARRoL's part of its record.

The worker scores each ARRoL sample once, at ``l_detect`` (:mod:`vllm_rl.arrol.scorer`),
and its verdict reaches the scheduler with the step's output (``StepOutput.verdicts``,
:mod:`vllm_rl.step_output`).  The scheduler keeps the first verdict of a sample in its
:class:`ArrolSample`, applies the composition rule (a sample scored while its DARTS group
is at M is kept whatever its coin said: ``floor``) and ends a pruned sample in the same step
(:mod:`vllm_rl.engine.scheduler`).  This module reads the verdict and writes ARRoL's
fields of the record (Alg. 1 l.15-21: the head's score s', the calibrated q (Eq. 1)
and survival p (Eq. 2), the head version, and the trace features).
"""
from __future__ import annotations

from dataclasses import dataclass

from vllm_rl.arrol.rule import ArrolVerdict
from vllm_rl.outcome import Reason


@dataclass
class ArrolSample:
    """ARRoL's state of one sample in the scheduler."""

    request_id: str
    verdict: ArrolVerdict | None = None   # its verdict at l_detect (the first one)
    pending: bool = False                 # pruned by its verdict, not yet ended
    floor: bool = False                   # scored at its DARTS group's floor of M


def verdict(raw: tuple) -> ArrolVerdict:
    """A verdict as it crossed from the worker (a plain tuple once pickled)."""
    return raw if isinstance(raw, ArrolVerdict) else ArrolVerdict(*raw)


def survival_weight(sample: ArrolSample | None) -> float | None:
    """The p a sample survived ARRoL's coin with (None: not scored, cold start, or
    scored at a DARTS group's floor, where no coin decided)."""
    v = None if sample is None else sample.verdict
    if v is None or not v.p or sample.floor:
        return None
    return v.p


def fields(sample: ArrolSample, reason: Reason) -> dict:
    """ARRoL's fields of the sample's record (nothing if it was never scored).  With
    ``return_hidden`` the hidden state stays on the worker under the request id
    (:mod:`vllm_rl.arrol.hidden`); the record names that key, never the vector."""
    v = sample.verdict
    if v is None:
        return {}
    return {"score": v.score, "q": v.q, "p": v.p, "head_version": v.version,
            "pruned": reason is Reason.ARROL_PRUNED,
            "hidden_id": sample.request_id if v.hidden else None,
            "trace": list(v.trace) if v.trace is not None else None,
            "floor": True if sample.floor else None, "head_auc": v.auc}


__all__ = ["ArrolSample", "fields", "survival_weight", "verdict"]
