"""Group membership and state: which requests sample the same prompt, and how far they are.

A group is known by ``group.id``; its members arrive as the ``n`` children of one
request or as ``M'`` single requests sharing the id (verl's way).  A group holds ``M'``
arrivals: a member that arrives with the id of a group whose ``M'`` have all arrived
begins a new group, so an id reused while its first group is live (a dataset index sent
again at the next step, say) never merges two groups.  The registry keeps one
:class:`GroupState` per id for the group that is taking arrivals; a group that has all
its members lives on in its members and leaves with the last of them.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from vllm_rl.arrol.engine import ArrolSample
from vllm_rl.das.engine import DasSample
from vllm_rl.duet.rule import DuetState
from vllm_rl.flags import GroupFlags, RLFlags


@dataclass
class Member:
    """The RL state of one request, attached to it once at admission: each technique's
    own typed state (None where the request does not use it), its group, and what the
    record needs of the engine (its weight versions)."""

    request_id: str
    flags: RLFlags
    group: "GroupState | None" = None
    finish_rank: int | None = None
    duet: DuetState | None = None
    das: DasSample | None = None
    arrol: ArrolSample | None = None
    ended: bool = False         # its record is written (an early or a natural end)
    weight_version: int = 0     # the engine's weight version of its first token
    # weight syncs it ran across: (new version, output-token index where it began); a
    # tuple, shared empty until the first sync (no object per request)
    version_starts: tuple[tuple[int, int], ...] = ()
    prior: int = 0              # partial rollouts: tokens made in earlier steps (a
                                # continuation's prompt ends with them)
    carried: bool = False       # partial rollouts: its step ended first

    def __post_init__(self) -> None:
        if self.flags.partial is not None:
            self.prior = self.flags.partial.prior_tokens

    def length(self, num_output_tokens: int) -> int:
        """The whole sample's length: this part's tokens and those before it."""
        return self.prior + num_output_tokens


@dataclass
class GroupState:
    flags: GroupFlags
    live: dict[str, Member] = field(default_factory=dict)   # not yet ended
    arrived: int = 0
    left: int = 0
    ended: int = 0            # ended by the model (any reason but cancellation)
    valid: int = 0            # of which complete answers (EOS / stop / DUET trim)
    finished: list[tuple[int, int]] = field(default_factory=list)  # valid: (length, rank)
    stopped: bool = False     # early stop fired: every live member is to be cancelled
    full_at_step: int | None = None   # engine step at which the M-th valid sample ended
    carried: int = 0          # members carried into the next step (partial rollouts)

    @property
    def complete(self) -> bool:
        return self.left >= self.flags.redundant and not self.live

    @property
    def done(self) -> bool:
        """Complete with no member carried: every sample has its end."""
        return self.complete and not self.carried


class GroupRegistry:
    def __init__(self) -> None:
        self.groups: dict[str, GroupState] = {}

    def join(self, member: Member) -> GroupState:
        g = member.flags.group
        assert g is not None
        state = self.groups.get(g.id)
        if state is None or state.arrived >= state.flags.redundant:
            state = self.groups[g.id] = GroupState(flags=g)
            partial = member.flags.partial
            if partial is not None and partial.group_ended:
                _ended_before(state, partial.group_ended)
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
        if state.complete and self.groups.get(state.flags.id) is state:
            del self.groups[state.flags.id]

    def __len__(self) -> int:
        return len(self.groups)


def _ended_before(state: GroupState, ended: tuple[tuple[int, bool], ...]) -> None:
    """A group continued from an earlier step: its members that ended there (or were
    dropped) arrived, ended and left, in the order given (their finish ranks)."""
    for length, valid in ended:
        state.arrived += 1
        state.left += 1
        state.ended += 1
        if valid:
            state.valid += 1
            state.finished.append((length, state.ended))
