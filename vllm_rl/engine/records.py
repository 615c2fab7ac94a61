"""The one writer of a flagged sample's record (:class:`~vllm_rl.outcome.RolloutInfo`).

Every early end and every natural end of a flagged sample goes through
:func:`write`, once, when the scheduler ends it; each technique contributes its own
fields (:func:`vllm_rl.das.engine.fields`, :func:`vllm_rl.arrol.engine.fields`,
:meth:`vllm_rl.duet.engine.DuetEngine.fields`) and the weight is composed here:

* 0 for a sample that leaves the training group (cancelled by DARTS, pruned by ARRoL,
  aborted at DUET's gate, dropped past the staleness cap) and for a carried part (its
  sample's weight is its continuation's);
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
from vllm_rl.outcome import Reason, RolloutInfo, token_spans

if TYPE_CHECKING:
    from vllm.v1.request import Request

    from vllm_rl.engine.groups import Member


def weight(member: "Member", reason: Reason) -> float:
    """The sample's importance weight in the loss (see the module docstring)."""
    if reason in (Reason.DARTS_CANCELLED, Reason.ARROL_PRUNED, Reason.CARRIED, Reason.STALE):
        return 0.0
    if member.duet is not None:
        return DuetEngine.weight(member.duet, reason)
    return 1.0


def write(request: "Request", member: "Member", reason: Reason) -> None:
    """Write ``member``'s record into ``request.stop_reason`` (vLLM's own stop string or
    token, if it ended on one, is kept in ``stop``)."""
    length = member.length(request.num_output_tokens)
    fields = version_fields(member, length)
    if member.das is not None:
        fields.update(das.fields(member.das))
    if member.arrol is not None:
        fields.update(arrol.fields(member.arrol, reason))
    if member.duet is not None:
        fields.update(DuetEngine.fields(member.duet))
    if member.flags.partial is not None:
        fields.update(partial_fields(member))
    group = member.group
    request.stop_reason = RolloutInfo.carrier(
        reason=reason, length=length,
        weight=weight(member, reason),
        group_id=group.flags.id if group is not None else None,
        finish_rank=member.finish_rank,
        stop=request.stop_reason if reason in (Reason.EOS, Reason.STOP) else None,
        **fields)


def version_fields(member: "Member", length: int) -> dict:
    """The weight version of the sample's first token; where it ran across weight syncs,
    each version and the output-token index where it began.  A continuation's spans
    cover the whole sample: the earlier steps' (``partial.prior_versions``), then this
    part's from token ``prior`` on.  Only spans that hold a token of the ``length``
    are kept (:func:`vllm_rl.outcome.token_spans`), so a record sent back as a
    continuation's ``prior_versions`` is always valid: a sync after the last token (a
    continuation still queued when its step ended, a sample carried right after a sync)
    leaves no empty span."""
    spans = [[member.weight_version, 0]] + [[v, i] for v, i in member.version_starts]
    partial = member.flags.partial
    if member.prior and partial is not None:
        prior = [list(pair) for pair in partial.prior_versions or ()]
        spans = prior + [[v, i + member.prior] for v, i in spans]
    spans = token_spans(spans, length)
    if len(spans) == 1:
        return {"weight_version": spans[0][0]}
    return {"weight_version": spans[0][0], "weight_versions": spans}


def partial_fields(member: "Member") -> dict:
    """Partial rollouts: the step the sample ends in, the step it started in, how many
    steps it crossed, and the tokens made before this part."""
    p = member.flags.partial
    if p.step is None:
        return {"prior_tokens": member.prior or None}
    start = p.step if p.start_step is None else p.start_step
    return {"step": p.step, "start_step": start, "steps_crossed": p.step - start,
            "prior_tokens": member.prior or None}


__all__ = ["partial_fields", "version_fields", "weight", "write"]
