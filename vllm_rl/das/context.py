"""The last tokens of each DAS request, for drafting under asynchronous scheduling.

Under vLLM's async scheduling the model runner keeps a step's sampled tokens on the
device: its CPU token array holds placeholders (-1) where the outputs are, so the
drafter cannot read its contexts there as it does when vLLM schedules synchronously.
The tree reads only the last ``max_depth`` tokens of a context
(``csrc/suffix_tree.h``, "only the last max_depth are read"), so each request keeps
its own window of at least that many tokens: the prompt's tail at admission, then the
tokens it gets at each step.  A draft from a window equals the draft from the whole
context (``tests/unit/test_das_context.py``).

Rows are the drafter's slots (:class:`~vllm_rl.das.request_columns.Slots`); appending a step's
tokens is a few array operations for all rows.
"""
from __future__ import annotations

import numpy as np


class ContextWindows:
    """Per slot, a row of ``width = 2 * depth + max_new`` tokens of which the first
    ``length[slot]`` are the context's last tokens (at least ``min(depth, context)``).
    A row that would overflow keeps its last ``depth`` tokens first."""

    def __init__(self, depth: int, max_new: int, capacity: int = 256) -> None:
        self.depth = int(depth)
        self.width = 2 * self.depth + int(max_new)
        self.tokens = np.zeros((capacity, self.width), dtype=np.int32)
        self.length = np.zeros(capacity, dtype=np.int64)

    def _fit(self, slot: int) -> None:
        cap = len(self.length)
        if slot < cap:
            return
        new = max(2 * cap, slot + 1)
        tokens = np.zeros((new, self.width), dtype=np.int32)
        tokens[:cap] = self.tokens
        length = np.zeros(new, dtype=np.int64)
        length[:cap] = self.length
        self.tokens, self.length = tokens, length

    def start_many(self, slots: np.ndarray, prompts: list[tuple[list, int]]) -> None:
        """Requests admitted in ``slots``: each one's window is the tail of its
        ``(prompt, length)``, ``prompt[:length]`` (samples of one prompt share its list:
        the tail is read once)."""
        if not len(slots):
            return
        self._fit(int(slots.max()))
        rows: dict[tuple[int, int], tuple] = {}
        for slot, (prompt, n) in zip(slots.tolist(), prompts):
            seen = rows.get((id(prompt), n))
            if seen is None:
                tail = np.asarray(prompt[max(0, n - self.depth):n], dtype=np.int32)
                seen = rows[id(prompt), n] = (prompt, tail, [])
            seen[2].append(slot)
        for _, tail, group in rows.values():
            idx = np.asarray(group, dtype=np.int64)
            self.tokens[idx, :len(tail)] = tail
            self.length[idx] = len(tail)

    def append(self, slots: np.ndarray, tokens: np.ndarray, offsets: np.ndarray) -> None:
        """Row ``i`` (slot ``slots[i]``, ``-1``: none) got ``tokens[offsets[i]:offsets[i+1]]``
        (at most ``max_new``)."""
        counts = np.diff(offsets)
        rows = np.flatnonzero((slots >= 0) & (counts > 0))
        if not len(rows):
            return
        s, c = slots[rows], counts[rows]
        over = self.length[s] + c > self.width
        if over.any():                                   # keep the last `depth` tokens
            so = s[over]
            start = self.length[so] - self.depth
            idx = start[:, None] + np.arange(self.depth)
            self.tokens[so, :self.depth] = self.tokens[so[:, None], idx]
            self.length[so] = self.depth
        if len(c) == int(c.sum()):                      # one token each (no drafts)
            self.tokens[s, self.length[s]] = tokens[offsets[rows]]
            self.length[s] += 1
            return
        total = int(c.sum())
        row_of = np.repeat(np.arange(len(rows)), c)
        within = np.arange(total) - np.repeat(np.cumsum(c) - c, c)
        src = np.repeat(offsets[rows], c) + within
        self.tokens[s[row_of], self.length[s][row_of] + within] = tokens[src]
        self.length[s] += c

    def view(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The rows' windows as the batched draft reads them: ``(contexts, lengths)``,
        int32 (a row without a slot has an empty context)."""
        safe = np.maximum(slots, 0)
        lengths = np.where(slots >= 0, self.length[safe], 0).astype(np.int32)
        return np.ascontiguousarray(self.tokens[safe]), lengths


__all__ = ["ContextWindows"]
