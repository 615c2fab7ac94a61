"""The one writer of a flagged sample's record (:class:`~vllm_rl.outcome.RolloutInfo`).

Every early end and every natural end of a flagged sample goes through
:func:`write`, once, when the scheduler ends it; each technique contributes its own
fields (:func:`vllm_rl.das.engine.fields`, :func:`vllm_rl.arrol.engine.fields`,
:meth:`vllm_rl.duet.engine.DuetEngine.fields`) and the weight is composed here:

* 0 for a sample that leaves the training group (cancelled by DARTS, pruned by ARRoL,
  aborted at DUET's gate);
* 1/eps for one DUET's coin kept past the gate (Eq. 6), else 1.

The record goes into the request's ``stop_reason`` (``"vllm_rl:{json}"``), which vLLM
carries to ``RequestOutput`` and the OpenAI response.  It is compact: no hidden state
(``arrol.return_hidden`` leaves it on the worker: ``hidden_id``).  Per sample, once, at
its end; never per step.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from vllm_rl.arrol import engine as arrol
from vllm_rl.das import engine as das
from vllm_rl.duet.engine import DuetEngine
from vllm_rl.outcome import Reason, RolloutInfo

if TYPE_CHECKING:
    from vllm.v1.request import Request

    from vllm_rl.engine.groups import Member


def weight(member: "Member", reason: Reason) -> float:
    """The sample's importance weight in the loss (see the module docstring)."""
    if reason in (Reason.DARTS_CANCELLED, Reason.ARROL_PRUNED):
        return 0.0
    if member.duet is not None:
        return DuetEngine.weight(member.duet, reason)
    return 1.0


def write(request: "Request", member: "Member", reason: Reason) -> None:
    """Write ``member``'s record into ``request.stop_reason`` (vLLM's own stop string or
    token, if it ended on one, is kept in ``stop``)."""
    fields = version_fields(member)
    if member.das is not None:
        fields.update(das.fields(member.das))
    if member.arrol is not None:
        fields.update(arrol.fields(member.arrol, reason))
    if member.duet is not None:
        fields.update(DuetEngine.fields(member.duet))
    group = member.group
    request.stop_reason = RolloutInfo(
        reason=reason, length=request.num_output_tokens, weight=weight(member, reason),
        group_id=group.flags.id if group is not None else None,
        finish_rank=member.finish_rank,
        stop=request.stop_reason if reason in (Reason.EOS, Reason.STOP) else None,
        **fields).encode()


def version_fields(member: "Member") -> dict:
    """The weight version of the sample's first token; where it ran across weight syncs,
    each version and the output-token index where it began."""
    if not member.version_starts:
        return {"weight_version": member.weight_version}
    spans = [[member.weight_version, 0]] + [[v, i] for v, i in member.version_starts]
    return {"weight_version": member.weight_version, "weight_versions": spans}


__all__ = ["version_fields", "weight", "write"]
