"""DAS in the engine: per sample, the draft tokens it was verified on and how many the
model accepted (Sec. 4.2, Eq. 3's counts), for its record.

The drafter runs on the worker (:mod:`vllm_rl.das.drafter`); vLLM's rejection sampler
verifies its drafts, so a sample's tokens are the model's own either way.  The
scheduler sees, per step, the drafts it scheduled and the tokens each request got back:
:func:`count_drafts` adds them to the samples' counts (one pass over the step's
speculative requests), and the accepted ones a sample keeps (not past a stop) are added
at its update (:func:`keep_accepted`).

When DAS switched itself off: the drafter's cost cap turns drafting off for the whole
batch where verification would cost more than it saves (:mod:`vllm_rl.das.batch_caps`).  The
scheduler counts the engine steps in which DAS samples were in the engine and none was
verified on a draft (:class:`QuietSteps`); each sample's record says how many of them
fell in its life (``draft_off_steps``) and in how many steps it was itself verified on
drafts (``draft_rounds``).
"""
from __future__ import annotations

from dataclasses import dataclass


class QuietSteps:
    """The engine's count of steps with DAS samples in the engine in which no sample was
    verified on a draft (the cost cap had drafting off, or no tree had a continuation);
    a sample keeps the count at its admission, so its record has the steps of its life."""

    __slots__ = ("steps",)

    def __init__(self) -> None:
        self.steps = 0


@dataclass
class DasSample:
    """DAS's state of one sample in the scheduler (its record's counts)."""

    quiet: QuietSteps           # the engine's count of steps with no draft verified
    quiet_from: int             # its value at admission
    proposed: int = 0           # draft tokens this sample was verified on
    accepted: int = 0           # of which the model accepted (and the sample kept)
    rounds: int = 0             # steps in which it was verified on at least one draft
    step_accepted: int = 0      # accepted this step, until the update sees what is kept
    tokens_before: int = 0      # output tokens before this step's update


class DasEngine:
    """DAS's state in the RL scheduler (:mod:`vllm_rl.engine.scheduler` owns one, as it
    owns DUET's :class:`~vllm_rl.duet.engine.DuetEngine`): whether the engine drafts
    with DAS's drafter, the samples with DAS flags in the engine, the steps none of them
    was verified on a draft, and the drafter's last decision under async scheduling
    (each step's ``StepOutput.drafting`` / ``drafts_for``, :mod:`vllm_rl.step_output`)."""

    __slots__ = ("drafter", "live", "quiet", "drafting", "drafts_for")

    def __init__(self, drafter: bool) -> None:
        self.drafter = drafter          # the engine drafts with DAS's drafter
        self.live = 0                   # samples with DAS flags in the engine (they draft)
        self.quiet = QuietSteps()       # steps with DAS samples and no draft verified
        self.drafting = True            # async: the drafter's last decision drafts ...
        self.drafts_for: frozenset | None = None    # ... for these only (None: all)

    def admit(self) -> DasSample:
        """A DAS sample joins: it reads the engine's quiet steps from now on."""
        self.live += 1
        return DasSample(self.quiet, self.quiet.steps)

    def leave(self) -> None:
        """A DAS sample left the engine (vLLM freed it)."""
        self.live -= 1

    def decided(self, drafting: bool, drafts_for: frozenset | None) -> None:
        """The drafter's decision in a step's output (async scheduling)."""
        self.drafting, self.drafts_for = drafting, drafts_for

    def count(self, members: dict, requests: dict, spec_tokens: dict, sampled,
              index: dict, drafted: dict | None) -> None:
        """Before vLLM's update, with DAS samples in the engine (the scheduler checks
        :attr:`live` first): the step's drafts counted on its samples
        (:func:`count_drafts`), and a step in which none was verified on a draft
        counted as quiet."""
        if not (spec_tokens and count_drafts(members, requests, spec_tokens, sampled,
                                             index, drafted)):
            self.quiet.steps += 1

    def schedules_drafts(self) -> bool:
        """Whether a step may give placeholders at all: with DAS samples in the engine
        and the drafter's last decision drafting."""
        return bool(self.live) and self.drafting

    def cut_placeholders(self, scheduled, requests: dict, members: dict) -> None:
        """After vLLM scheduled a step with placeholder drafts: only the requests the
        drafter drafts for keep theirs (its probe's ``drafts_for``), else only the
        samples with DAS flags (none cut when every scheduled request has them)."""
        only = self.drafts_for
        if only is not None:
            for req_id in scheduled:
                if req_id not in only:
                    requests[req_id].spec_token_ids = []
        elif self.live < len(scheduled):
            for req_id in scheduled:
                member = members.get(req_id)
                if member is None or member.flags.das is None:
                    requests[req_id].spec_token_ids = []


def count_drafts(members: dict, requests: dict, spec_tokens: dict, sampled,
                 index: dict, drafted: dict | None = None) -> int:
    """Before vLLM's update, per flagged sample in ``spec_tokens``
    (``SchedulerOutput.scheduled_spec_decode_tokens``): draft tokens verified this step,
    how many were accepted (``sampled``/``index``: the step's
    ``ModelRunnerOutput.sampled_token_ids`` / ``req_id_to_index``), and its length
    before the update (what it keeps is known after it: :func:`keep_accepted`).

    Under async scheduling the scheduler's ``spec_tokens`` are placeholders (-1) and the
    worker verified each sample on its real draft only: ``drafted`` (the step's
    ``StepOutput.drafts``, :mod:`vllm_rl.step_output`) has those counts, one per sample
    that verified a draft.  A sample outside it sampled one token and accepted nothing,
    which its ``step_accepted`` already says (:func:`keep_accepted` zeroes it after
    each update), so only ``drafted``'s samples are visited: the step's drafting rows,
    not its batch.  Returns the draft tokens verified in the step (flagged samples)."""
    if not sampled:
        return 0
    total = 0
    if drafted is not None:
        counted = ((rid, k) for rid, k in drafted.items() if rid in spec_tokens)
    else:
        counted = ((rid, sum(1 for t in spec if t >= 0)) for rid, spec in spec_tokens.items())
    for req_id, k in counted:
        member = members.get(req_id)
        i = index.get(req_id)
        request = requests.get(req_id)
        if member is None or member.das is None or i is None or request is None \
                or not sampled[i]:
            continue
        sample = member.das
        if k:
            sample.proposed += k
            sample.rounds += 1
            total += k
        sample.step_accepted = len(sampled[i]) - 1
        sample.tokens_before = request.num_output_tokens
    return total


def keep_accepted(sample: DasSample, num_output_tokens: int) -> None:
    """After the update: of this step's accepted drafts, those the sample kept (its
    tokens past a stop are dropped by vLLM, accepted or not)."""
    kept = num_output_tokens - sample.tokens_before
    sample.accepted += max(0, min(sample.step_accepted, kept))
    sample.step_accepted = 0


def fields(sample: DasSample) -> dict:
    """DAS's fields of the sample's record."""
    return {"draft_proposed": sample.proposed, "draft_accepted": sample.accepted,
            "draft_rounds": sample.rounds,
            "draft_off_steps": sample.quiet.steps - sample.quiet_from}


__all__ = ["DasEngine", "DasSample", "QuietSteps", "count_drafts", "fields", "keep_accepted"]
