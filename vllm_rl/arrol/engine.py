"""ARRoL in the engine: a scored sample's verdict, and ARRoL's part of its record.

The worker scores each ARRoL sample once, at ``l_detect`` (:mod:`vllm_rl.arrol.scorer`),
and its verdict reaches the scheduler with the step's output
(``ModelRunnerOutput.vllm_rl_arrol``).  The scheduler keeps the first verdict of a
sample, applies the composition rule (a sample scored while its DARTS group is at M is
kept whatever its coin said: ``floor``) and ends a pruned sample in the same step
(:mod:`vllm_rl.engine.scheduler`).  This module reads the verdict and writes ARRoL's
fields of the record (Alg. 1 l.15-21: the head's score s', the calibrated q (Eq. 1)
and survival p (Eq. 2), the head version, and the trace features).
"""
from __future__ import annotations

from typing import Any

from vllm_rl.arrol.rule import ArrolVerdict
from vllm_rl.outcome import Reason


def verdict(raw: tuple) -> ArrolVerdict:
    """A verdict as it crossed from the worker (a plain tuple once pickled)."""
    return raw if isinstance(raw, ArrolVerdict) else ArrolVerdict(*raw)


def survival_weight(member: Any) -> float | None:
    """The p a sample survived ARRoL's coin with (None: not scored, cold start, or
    scored at a DARTS group's floor, where no coin decided)."""
    v = member.arrol
    if v is None or not v.p or member.arrol_floor:
        return None
    return v.p


def fields(member: Any, reason: Reason) -> dict:
    """ARRoL's fields of the sample's record (nothing if it was never scored).  With
    ``return_hidden`` the hidden state stays on the worker under the request id
    (:mod:`vllm_rl.arrol.hidden`); the record names that key, never the vector."""
    v = member.arrol
    if v is None:
        return {}
    return {"score": v.score, "q": v.q, "p": v.p, "head_version": v.version,
            "pruned": reason is Reason.ARROL_PRUNED,
            "hidden_id": member.request_id if v.hidden else None,
            "trace": list(v.trace) if v.trace is not None else None,
            "floor": True if member.arrol_floor else None, "head_auc": v.auc}


__all__ = ["fields", "survival_weight", "verdict"]
