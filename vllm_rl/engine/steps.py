"""Partial rollouts: each trainer step's rule, and the samples it carries (APRIL).

A request with ``partial`` flags belongs to a step (``partial.step``, the trainer's).
The step ends once its rule holds (:class:`~vllm_rl.flags.PartialFlags`: ``until_groups``
complete groups, ``until_tokens`` generated, ``until_s`` seconds since its first
request arrived; the first request's rule is the step's); the scheduler then ends its
samples still generating, with reason ``carried`` (or ``stale`` past
``max_staleness``), in the same step, through vLLM's ``finish_requests``: KV freed, the
tokens and logprobs produced returned with the record.  A request that arrives while
its ended step still has samples live is carried at its first step; once none is left
the step is forgotten (a step number used again starts afresh).

A drop-in whose step runs on several engines (verl's replicas, OpenRLHF's rollout
actors) counts the complete groups itself and ends the step on every engine at once
(:meth:`StepBook.end`, the engine-core utility ``vllm_rl_end_step``); its requests
then carry no ``until_groups``.

Per engine step the book costs one check per step that has live samples (a count, a
clock read); ``until_tokens`` adds a sum over that step's live samples.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from vllm_rl.flags import PartialFlags

if TYPE_CHECKING:
    from vllm_rl.engine.groups import Member


@dataclass
class StepState:
    """One trainer step as the engine sees it."""

    rule: PartialFlags
    started: float
    live: dict[str, "Member"] = field(default_factory=dict)
    complete: int = 0           # groups complete (every member ended, none carried)
    ended_tokens: int = 0       # tokens of its samples that left (this part's)
    ended: bool = False         # its rule held: every sample still live is carried

    def due(self, requests: dict) -> bool:
        """Whether the step's rule holds now."""
        rule = self.rule
        if rule.until_groups is not None and self.complete >= rule.until_groups:
            return True
        if not self.complete:           # a step never ends with nothing to train on
            return False
        if rule.until_s is not None and time.monotonic() - self.started >= rule.until_s:
            return True
        if rule.until_tokens is not None:
            tokens = self.ended_tokens
            for rid in self.live:
                request = requests.get(rid)
                if request is not None:
                    tokens += request.num_output_tokens
            return tokens >= rule.until_tokens
        return False


class StepBook:
    """The steps with live samples, by ``partial.step``."""

    def __init__(self) -> None:
        self.steps: dict[int, StepState] = {}

    def join(self, member: "Member") -> None:
        partial = member.flags.partial
        state = self.steps.get(partial.step)
        if state is None:
            state = self.steps[partial.step] = StepState(partial, time.monotonic())
        state.live[member.request_id] = member

    def leave(self, member: "Member", tokens: int, complete_groups: int) -> None:
        """``member``'s request is gone after ``tokens`` tokens (this part's); it
        completed ``complete_groups`` groups (0 or 1)."""
        state = self.steps.get(member.flags.partial.step)
        if state is None or state.live.pop(member.request_id, None) is None:
            return
        state.ended_tokens += tokens
        state.complete += complete_groups
        if not state.live:
            del self.steps[member.flags.partial.step]

    def end(self, step: int) -> int:
        """End ``step`` now, whatever its rule (a drop-in whose rule held across its
        engines says so: ``vllm_rl_end_step``); returns how many of its samples are live
        (carried at the engine's next step), 0 for a step with none."""
        state = self.steps.get(step)
        if state is None:
            return 0
        state.ended = True
        return len(state.live)

    def due(self, requests: dict) -> list[StepState]:
        """The steps whose samples are to be carried now: their rule holds (or held)."""
        out = []
        for state in self.steps.values():
            if state.ended or state.due(requests):
                state.ended = True
                out.append(state)
        return out

    def __bool__(self) -> bool:
        return bool(self.steps)


def stale(member: "Member") -> bool:
    """Carrying ``member`` once more would take it past ``max_staleness`` steps."""
    p = member.flags.partial
    start = p.step if p.start_step is None else p.start_step
    return p.max_staleness is not None and p.step + 1 - start > p.max_staleness


__all__ = ["StepBook", "StepState", "stale"]
