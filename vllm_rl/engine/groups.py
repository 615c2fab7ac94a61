"""Group membership and state: which requests sample the same prompt, and how far they are.

A group is known by ``group.id``; its members arrive as the ``n`` children of one
request or as ``M'`` single requests sharing the id (verl's way).  The registry keeps
one :class:`GroupState` per live group and drops it once all ``M'`` members have left.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vllm_rl.flags import GroupFlags, RLFlags

if TYPE_CHECKING:
    from vllm_rl.arrol.rule import ArrolVerdict
    from vllm_rl.duet.rule import DuetState


@dataclass
class Member:
    """The RL state of one request, attached to it once at admission."""

    request_id: str
    flags: RLFlags
    group: "GroupState | None" = None
    finish_rank: int | None = None
    duet: "DuetState | None" = None
    arrol: "ArrolVerdict | None" = None   # ARRoL's verdict at l_detect
    arrol_pending: bool = False  # pruned by its verdict, not yet ended
    arrol_floor: bool = False    # its prune was overruled: its DARTS group was at M
    draft_proposed: int = 0     # speculative tokens this sample was verified on
    draft_accepted: int = 0     # of which the model accepted (and the sample kept)
    draft_rounds: int = 0       # steps in which it was verified on at least one draft
    das_quiet: Any = None       # the engine's das.QuietSteps (a DAS sample)
    das_quiet_from: int = 0     # its count at admission
    step_accepted: int = 0      # accepted this step, until the update sees what is kept
    tokens_before: int = 0      # output tokens before this step's update (DAS counts)
    ended: bool = False         # its record is written (an early or a natural end)
    weight_version: int = 0     # the engine's weight version of its first token
    # weight syncs it ran across: (new version, output-token index where it began)
    version_starts: list[tuple[int, int]] = field(default_factory=list)


@dataclass
class GroupState:
    flags: GroupFlags
    rl: RLFlags
    live: dict[str, Member] = field(default_factory=dict)   # not yet ended
    arrived: int = 0
    left: int = 0
    ended: int = 0            # ended by the model (any reason but cancellation)
    valid: int = 0            # of which complete answers (EOS / stop / DUET trim)
    finished: list[tuple[int, int]] = field(default_factory=list)  # valid: (length, rank)
    stopped: bool = False     # early stop fired: every live member is to be cancelled
    full_at_step: int | None = None   # engine step at which the M-th valid sample ended

    @property
    def complete(self) -> bool:
        return self.left >= self.flags.redundant and not self.live


class GroupRegistry:
    def __init__(self) -> None:
        self.groups: dict[str, GroupState] = {}

    def join(self, member: Member) -> GroupState:
        g = member.flags.group
        assert g is not None
        state = self.groups.get(g.id)
        if state is None:
            state = self.groups[g.id] = GroupState(flags=g, rl=member.flags)
        state.live[member.request_id] = member
        state.arrived += 1
        member.group = state
        return state

    def record_end(self, member: Member, valid: bool, length: int) -> None:
        """A member ended by the model; ranks follow the order of ending (the engine's
        processing order within a step), and break ties between equal lengths."""
        state = member.group
        assert state is not None
        state.ended += 1
        member.finish_rank = state.ended
        if valid:
            state.valid += 1
            state.finished.append((length, member.finish_rank))

    def leave(self, member: Member) -> None:
        """The member's request is gone (finished, cancelled or aborted by the client)."""
        state = member.group
        if state is None or state.live.pop(member.request_id, None) is None:
            return
        state.left += 1
        if state.complete:
            self.groups.pop(state.flags.id, None)

    def __len__(self) -> int:
        return len(self.groups)
