"""One step's work for the ARRoL scorer (:class:`Plan`): the rows it scores at
``l_detect`` (:class:`Candidate`) and the samples whose trace sums its tokens feed, made
before vLLM samples (:meth:`vllm_rl.arrol.scorer.HeadScorer.plan`) and closed after it."""
from __future__ import annotations

import numpy as np

from vllm_rl.arrol.served_head import Head

EMPTY = np.zeros(0, dtype=np.int64)


class Candidate:
    """A row scored this step; ``needs``: 0 for a real token, j > 0 for the j-th draft
    (kept only if accepted); ``hidden``: its row in ``Plan.hidden`` (-1: none)."""

    __slots__ = ("rid", "owner", "flags", "share", "needs", "hidden")

    def __init__(self, rid, owner, flags, share, needs, hidden) -> None:
        self.rid, self.owner, self.flags, self.share, self.needs, self.hidden = (
            rid, owner, flags, share, needs, hidden)


class Plan:
    """One step's work: the scored rows (``values``: their score and trace features on
    the host once the step has synchronised, ``hidden``: the hidden rows asked for) and
    the tracked samples (``t_slot``, ``t_index``: their trace slots and batch indices,
    ``t_k``, ``t_count``: their first row and row count among the tracked logits rows;
    ``src``: a copy of those rows' raw logits [K, V]; ``lse``, ``ent``: [K])."""

    __slots__ = ("head", "rows", "t_slot", "t_index", "t_k", "t_count", "src", "lse",
                 "ent", "values", "hidden", "ready")

    def __init__(self, head: Head) -> None:
        self.head = head
        self.rows: list[Candidate] = []
        self.t_slot = self.t_index = self.t_k = self.t_count = EMPTY
        self.src = self.lse = self.ent = None
        self.values = self.hidden = self.ready = None

    @property
    def tracked(self) -> int:
        return len(self.t_slot)

    def __bool__(self) -> bool:
        return bool(self.rows) or len(self.t_slot) > 0


__all__ = ["EMPTY", "Candidate", "Plan"]
