"""The DAS drafter's running requests as numpy columns, one row ("slot") per request.

A decode step reads and updates every running request's counters (tokens generated,
passes, Eq. 3's acceptance counts, its length class and budget, Sec. 4.2.3); keeping them
in columns lets :class:`vllm_rl.das.drafter.DASProposer` do that with a few array
operations per step instead of a Python loop over the requests.  A slot is taken when a
request is admitted and given back when it leaves the runner.
"""
from __future__ import annotations

import numpy as np

FIXED, CLASS, OPTIMAL = 0, 1, 2         # budget policies (Sec. 4.2), as stored in `policy`
POLICY_CODES = {"fixed": FIXED, "class": CLASS, "optimal": OPTIMAL}

_INT = ("seq", "generated", "steps", "max_tokens", "budget", "class_budget", "next_check",
        "est_proposed", "est_accepted", "est_generated", "pend_drafted", "pend_accepted",
        "problem_key")


class Slots:
    """Per-request columns (int64 unless noted), indexed by slot:

    ``seq`` (the rollout's sequence id in the store), ``generated`` (output tokens fed),
    ``steps`` (passes that gave it tokens), ``max_tokens``, ``budget`` (b),
    ``class_budget`` (its length class's budget), ``next_check`` (generated tokens at the
    next class update), ``est_proposed/accepted/generated`` (Eq. 3's counts),
    ``pend_drafted/accepted`` (counts not yet added to its problem's totals),
    ``problem_key`` (its problem, for per-problem acceptance); ``policy`` and ``rank``
    (length class, :data:`vllm_rl.das.length_classes.CLASSES` index) int8, ``min_prob`` float64,
    ``done`` bool (sealed at a natural end), ``force`` bool (``das.force``: drafts past
    the batch cap), ``guess_ok`` bool (async lookahead: the last step taken in came out
    as its drafts' lookahead assumed, so the drafts made on it stand); ``epoch`` int64,
    bumped when the slot is taken or given back, never zeroed (rows mapped to slots
    earlier are still those requests while their slots' epochs are unchanged)."""

    def __init__(self, capacity: int = 256) -> None:
        self.capacity = 0
        self._free: list[int] = []
        self.used = 0
        self._grow(capacity)

    def _grow(self, capacity: int) -> None:
        old = self.capacity
        for name in _INT:
            self._resize(name, np.int64, capacity)
        self._resize("policy", np.int8, capacity)
        self._resize("rank", np.int8, capacity)
        self._resize("min_prob", np.float64, capacity)
        self._resize("done", np.bool_, capacity)
        self._resize("force", np.bool_, capacity)
        self._resize("guess_ok", np.bool_, capacity)
        self._resize("epoch", np.int64, capacity)
        self._free.extend(range(capacity - 1, old - 1, -1))
        self.capacity = capacity

    def _resize(self, name: str, dtype, capacity: int) -> None:
        col = np.zeros(capacity, dtype=dtype)
        if self.capacity:
            col[:self.capacity] = getattr(self, name)
        setattr(self, name, col)

    def take_many(self, n: int) -> np.ndarray:
        """``n`` free slots, the most recently given back first, their columns zeroed
        and their epochs bumped."""
        while len(self._free) < n:
            self._grow(2 * self.capacity)
        taken = np.array(self._free[-n:][::-1], dtype=np.int64) if n else \
            np.zeros(0, dtype=np.int64)
        del self._free[len(self._free) - n:]
        for name in _INT + ("policy", "rank", "min_prob", "done", "force", "guess_ok"):
            getattr(self, name)[taken] = 0
        self.epoch[taken] += 1
        self.used += n
        return taken

    def give_back(self, slot: int) -> None:
        self.epoch[slot] += 1
        self._free.append(slot)
        self.used -= 1


__all__ = ["CLASS", "FIXED", "OPTIMAL", "POLICY_CODES", "Slots"]
