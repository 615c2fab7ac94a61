"""DAS in the engine: per sample, the draft tokens it was verified on and how many the
model accepted (Sec. 4.2, Eq. 3's counts), for its record.

The drafter runs on the worker (:mod:`vllm_rl.das.drafter`); vLLM's rejection sampler
verifies its drafts, so a sample's tokens are the model's own either way.  The
scheduler sees, per step, the drafts it scheduled and the tokens each request got back:
:func:`count_drafts` adds them to the samples' counts (one pass over the step's
speculative requests), and the accepted ones a sample keeps (not past a stop) are added
at its update (:func:`keep_accepted`).
"""
from __future__ import annotations

from typing import Any


def count_drafts(members: dict, requests: dict, spec_tokens: dict, sampled,
                 index: dict, drafted: dict | None = None) -> None:
    """Before vLLM's update, per flagged sample in ``spec_tokens``
    (``SchedulerOutput.scheduled_spec_decode_tokens``): draft tokens verified this step,
    how many were accepted (``sampled``/``index``: the step's
    ``ModelRunnerOutput.sampled_token_ids`` / ``req_id_to_index``), and its length
    before the update (what it keeps is known after it: :func:`keep_accepted`).

    Under async scheduling the scheduler's ``spec_tokens`` are placeholders (-1) and the
    worker verified each sample on its real draft only: ``drafted`` (the step's
    ``ModelRunnerOutput.vllm_rl_drafts``, ``patches/das_async.py``) has those counts."""
    if not sampled:
        return
    for req_id, spec in spec_tokens.items():
        member = members.get(req_id)
        i = index.get(req_id)
        request = requests.get(req_id)
        if member is None or i is None or request is None or not sampled[i]:
            continue
        member.draft_proposed += (drafted.get(req_id, 0) if drafted is not None
                                  else sum(1 for t in spec if t >= 0))
        member.step_accepted = len(sampled[i]) - 1
        member.tokens_before = request.num_output_tokens


def keep_accepted(member: Any, num_output_tokens: int) -> None:
    """After the update: of this step's accepted drafts, those the sample kept (its
    tokens past a stop are dropped by vLLM, accepted or not)."""
    kept = num_output_tokens - member.tokens_before
    member.draft_accepted += max(0, min(member.step_accepted, kept))
    member.step_accepted = 0


def fields(member: Any) -> dict:
    """DAS's fields of the sample's record."""
    return {"draft_proposed": member.draft_proposed, "draft_accepted": member.draft_accepted}


__all__ = ["count_drafts", "fields", "keep_accepted"]
