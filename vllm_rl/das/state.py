"""The DAS drafter's typed state: a running request, a rollout round, one phase-cap
decision, and one step's rows as arrays (what :class:`~.drafter.DASProposer` and its
parts, :mod:`.requests`, :mod:`.draft_lengths` and :mod:`.async_drafts`, pass each other).
The per-request counters live in :class:`~.request_columns.Slots` columns; :class:`RequestState`
is a request's fixed part and a view of its row."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vllm_rl.das import budget_model as policy
from vllm_rl.das import length_classes
from vllm_rl.das.request_columns import Slots
from vllm_rl.flags import DasFlags


@dataclass
class RequestState:
    """One DAS request as the drafter tracks it: what is fixed at admission here, its
    counters in row ``slot`` of the drafter's :class:`~.request_columns.Slots` (the properties)."""

    problem: str
    seq: int
    flags: DasFlags
    max_tokens: int
    budget: int                         # b for this request
    min_prob: float
    slot: int
    slots: Slots = field(repr=False)
    init_class: str = length_classes.MEDIUM
    stop_ids: frozenset = frozenset()   # token ids that end it (EOS and stop tokens)
    budget_policy: str = "fixed"        # the budget policy (flags, else the engine's)

    @property
    def generated(self) -> int:         # output tokens fed so far
        return int(self.slots.generated[self.slot])

    @property
    def steps(self) -> int:             # forward passes that gave it tokens
        return int(self.slots.steps[self.slot])

    @property
    def done(self) -> bool:             # sealed: a natural end was seen
        return bool(self.slots.done[self.slot])

    @property
    def length_class(self) -> str:
        return length_classes.CLASSES[int(self.slots.rank[self.slot])]

    @property
    def est(self) -> policy.AcceptanceEstimate:
        """Its drafts: proposed, accepted, generated (Eq. 3's counts), a snapshot."""
        s, i = self.slots, self.slot
        return policy.AcceptanceEstimate(int(s.est_proposed[i]), int(s.est_accepted[i]),
                                         int(s.est_generated[i]))


@dataclass(frozen=True)
class PhaseStep:
    """One phase-aware decision (:meth:`DASProposer._phase`): the step's ``batch`` and mean
    ``context``, per drafting row its acceptance ``q``, draft ``caps`` (the tree's draft
    length within the policy budget) and chosen ``k``; ``verified``: draft tokens vLLM
    verified in this step (the previous decision's)."""

    step: int
    batch: int
    context: float
    q: tuple
    caps: tuple
    k: tuple
    verified: int
    probe: bool = False


@dataclass
class Round:
    """Totals of one rollout round (while any DAS request runs).  ``n_fwd`` is Eq. 4's
    N_fwd: the most forward passes one of its requests took."""

    steps: int = 0
    n_fwd: int = 0
    verifications: int = 0      # request-steps that verified a draft
    proposed: int = 0
    accepted: int = 0


@dataclass
class StepRows:
    """One call's rows, as arrays over vLLM's rows (``n`` of them)."""

    n: int
    slots: np.ndarray           # int64: the row's slot, -1 for a request without DAS
    safe: np.ndarray            # slots with -1 replaced by 0 (for gathers; mask with das)
    tokens: np.ndarray          # int32: sampled_token_ids flattened
    offsets: np.ndarray         # int64 [n + 1]: row i's tokens are tokens[offsets[i]:...]
    feed: np.ndarray            # int32: tokens each row appends to its rollout
    ntok: np.ndarray            # int64: num_tokens_no_spec
    max_tokens: np.ndarray      # int32: the draft budget per row (0: no draft)
    req_ids: Any = ()           # the rows' request ids
    ahead: np.ndarray | int = 0  # int64: tokens a row is assumed to have beyond its count
    min_prob: np.ndarray | None = None  # float64: the step's cutoff per row (None: each slot's)


__all__ = ["PhaseStep", "RequestState", "Round", "StepRows"]
