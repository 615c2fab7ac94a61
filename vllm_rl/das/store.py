"""The DAS tree store: one suffix tree per problem over a sliding window of its rollouts.

DAS drafts from rollouts of the *same problem* (Sec. 4.1.2, "Global suffix trees" and
"Per-request suffix trees": per-problem trees beat one global tree in acceptance and in
latency) built from a *sliding window* of recent rollouts ("Sliding window selection
tree": the paper's default window is 16).  :class:`ProblemTrees` keeps:

* per problem, a :class:`~vllm_rl.das.tree.SuffixTree` holding its rollouts still being
  generated (fed token by token) and its last ``window`` finished ones; a finished
  rollout beyond the window leaves, oldest first;
* a global cap on stored tokens: above it, finished rollouts leave oldest first across
  all problems (a rollout being generated never leaves);
* per problem, the output lengths of its rollouts in the window that ended naturally
  (the history the length classes of Sec. 4.2.3 start from; a cancelled or aborted
  rollout's tokens are kept, its length is not).

Per decode step the drafter feeds and drafts every row in one call,
:meth:`ProblemTrees.feed_and_draft`: the store resolves each row's sequence id to its
tree's index in a :class:`~vllm_rl.das.tree.TreeTable` (an array lookup) and accounts the
tokens in bulk, and one C++ call without the GIL extends every growing rollout and then
drafts for every row (:func:`vllm_rl.das.tree.feed_and_draft`).

Each stored sequence is the last ``prompt_tail`` prompt tokens followed by the rollout,
so the first output tokens of a new sample already have a context to match.  A tree
whose last rollout leaves is dropped (with ``defer_removals``, its memory once the
removals queued for it have run).  The store lives as long
as the engine's worker; model weights, sleep and wake never touch it.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from itertools import chain
from typing import Iterable, Sequence

import numpy as np

from vllm_rl.das.tree import BatchDrafts, SuffixTree, TreeTable, feed_and_draft, hypothesis_drafts


@dataclass
class Problem:
    tree: SuffixTree
    finished: deque = field(default_factory=deque)      # seq ids, oldest first
    lengths: deque = field(default_factory=deque)       # output lengths (None: cut short)
    growing: set = field(default_factory=set)
    requests: int = 0        # rollouts ever started or inserted
    drafted: int = 0         # draft tokens proposed from this tree
    accepted: int = 0        # of which accepted
    index: int = -1          # the tree's index in the store's TreeTable


class ProblemTrees:
    def __init__(self, window: int = 16, max_stored_tokens: int = 4_000_000,
                 max_depth: int = 64, prior: float = 0.0) -> None:
        self.window = window
        self.max_stored_tokens = max_stored_tokens
        self.max_depth = max_depth
        self.prior = prior          # λ of the drafts' probabilities (SuffixTree's prior)
        self.problems: dict[str, Problem] = {}
        self._size: dict[int, tuple[str, int]] = {}     # seq id -> (problem, tokens)
        self._fifo: deque[int] = deque()                # finished seq ids, global order
        self._next_seq = 0
        self.stored_tokens = 0
        self.table = TreeTable()                        # the trees by index, for batches
        # By sequence id (ids are dense): the table index of the tree a growing rollout
        # feeds (-1: finished, cleared or never started), and the tokens fed by batches
        # not yet folded into _size (folded when the rollout ends).
        self._tree_of = np.full(1024, -1, dtype=np.int32)
        self._batched = np.zeros(1024, dtype=np.int64)
        # With defer_removals (the drafter's background feed), the rollouts a window
        # drops leave their trees later, in remove(take_removals()) on the feeder thread;
        # the sizes and windows above count them out at once.
        self.defer_removals = False
        self._doomed: list[tuple[SuffixTree, int]] = []

    # ----------------------------------------------------------------- rollouts
    def problem(self, problem_id: str) -> Problem:
        p = self.problems.get(problem_id)
        if p is None:
            tree = SuffixTree(self.max_depth, self.prior)
            p = self.problems[problem_id] = Problem(tree, index=self.table.add(tree))
        return p

    def start(self, problem_id: str, prompt_tail: Sequence[int]) -> int:
        """A new rollout of ``problem_id``; returns its sequence id."""
        return int(self.start_many([problem_id], [list(prompt_tail)])[0])

    def start_many(self, problem_ids: Sequence[str], prompt_tails: Sequence[list]) -> np.ndarray:
        """:meth:`start` for many rollouts (int64 sequence ids, in order): their prompt
        tails fed in one call (:meth:`feed_and_draft`)."""
        n = len(problem_ids)
        seqs = np.empty(n, dtype=np.int64)
        for j, problem_id in enumerate(problem_ids):
            p = self.problem(problem_id)
            seq = seqs[j] = self._new_seq(problem_id)
            p.growing.add(seq)
            p.requests += 1
            self._tree_of[seq] = p.index
        lens = np.fromiter(map(len, prompt_tails), dtype=np.int64, count=n)
        if lens.any():
            offsets = np.zeros(n + 1, dtype=np.int64)
            np.cumsum(lens, out=offsets[1:])
            tokens = np.fromiter(chain.from_iterable(prompt_tails), dtype=np.int32,
                                 count=int(offsets[-1]))
            self.feed(seqs, tokens, offsets, lens.astype(np.int32))
        return seqs

    def extend(self, problem_id: str, seq: int, tokens: Sequence[int]) -> None:
        p = self.problems.get(problem_id)
        if not tokens or p is None or seq not in p.growing:
            return                       # cleared while it was being generated
        p.tree.extend(seq, list(tokens))
        self._grow(seq, len(tokens))

    def finish(self, problem_id: str, seq: int, output_len: int, natural: bool = True) -> None:
        """The rollout ended (``natural``: by itself): seal it and slide the window."""
        p = self.problems.get(problem_id)
        if p is None or seq not in p.growing:
            return
        p.growing.discard(seq)
        self._fold(seq)
        if seq in p.tree:
            p.tree.finish(seq)
            self._finished(problem_id, p, seq, output_len if natural else None)
        else:
            self._size.pop(seq, None)
            self._drop_if_empty(problem_id, p)

    def insert(self, problem_id: str, tokens: Sequence[int],
               prompt_tail: Sequence[int] = ()) -> None:
        """Add a finished rollout (prebuilding a tree from past rollouts)."""
        p = self.problem(problem_id)
        seq = self._new_seq(problem_id)
        p.requests += 1
        stored = list(prompt_tail) + list(tokens)
        if not stored:
            self._size.pop(seq, None)
            self._drop_if_empty(problem_id, p)
            return
        p.tree.insert(seq, stored)
        self._grow(seq, len(stored))
        self._finished(problem_id, p, seq, len(tokens))

    def clear(self, problem_id: str | None = None) -> int:
        """Drop one problem's tree (or all of them); returns the number dropped.

        Rollouts still being generated keep their sequence ids but stop feeding a tree
        (they re-enter the store at their next rollout).
        """
        ids = list(self.problems) if problem_id is None else [problem_id]
        dropped = 0
        for pid in ids:
            p = self.problems.pop(pid, None)
            if p is None:
                continue
            dropped += 1
            for seq in list(p.finished) + list(p.growing):
                self._fold(seq)
                _, n = self._size.pop(seq, (pid, 0))
                self.stored_tokens -= n
            self.table.remove(p.index)
        live = set(self._size)
        self._fifo = deque(s for s in self._fifo if s in live)
        return dropped

    def feed_and_draft(self, seqs: np.ndarray, tokens: np.ndarray, offsets: np.ndarray,
                       feed: np.ndarray, contexts: np.ndarray, context_len: np.ndarray,
                       max_tokens: np.ndarray, min_prob: np.ndarray,
                       backoff: bool = True) -> BatchDrafts:
        """One decode step for many rows (:func:`vllm_rl.das.tree.feed_and_draft`): row
        ``i`` appends ``tokens[offsets[i]:offsets[i] + feed[i]]`` to its growing rollout
        ``seqs[i]`` (int64; -1, or a rollout that is not growing in a live tree: the row
        is skipped, as :meth:`extend` skips it), then drafts ``max_tokens[i]`` tokens
        from ``contexts[i, :context_len[i]]`` at ``min_prob[i]``.  The ids of the rows
        that feed must be distinct.  Sizes are accounted in bulk; Python work is per
        step, not per row."""
        seqs = np.asarray(seqs, dtype=np.int64)
        tree_idx = self._account(seqs, feed)
        return feed_and_draft(self.table, tree_idx, seqs, tokens, offsets, feed, contexts,
                              context_len, max_tokens, min_prob, backoff)

    def _account(self, seqs: np.ndarray, feed: np.ndarray) -> np.ndarray:
        """The rows' trees, and their fed tokens added to the sizes in bulk."""
        tree_idx = self._tree_index(seqs)
        feeding = (tree_idx >= 0) & (feed > 0)
        fed = seqs[feeding]
        if len(fed):
            counts = feed[feeding].astype(np.int64)
            self._batched[fed] += counts
            self.stored_tokens += int(counts.sum())
        return tree_idx

    def feed_later(self, seqs: np.ndarray, tokens: np.ndarray, offsets: np.ndarray,
                   feed: np.ndarray):
        """:meth:`feed` in two halves: the rows' trees and sizes now, on the calling
        thread, and the C++ call returned, to run on another (the drafter's feeder
        thread: no Python state of the store is touched there)."""
        seqs = np.asarray(seqs, dtype=np.int64)
        tree_idx = self._account(seqs, feed)
        n = len(seqs)
        args = (self.table, tree_idx, seqs, tokens, offsets, feed, np.zeros((n, 1), np.int32),
                np.zeros(n, np.int32), np.zeros(n, np.int32), np.zeros(n), True)
        return lambda: feed_and_draft(*args)

    def feed(self, seqs: np.ndarray, tokens: np.ndarray, offsets: np.ndarray,
             feed: np.ndarray) -> BatchDrafts:
        """:meth:`feed_and_draft` with no row drafting: the rows' tokens into their
        trees (its ``feed_ns`` is the call's CPU time)."""
        return self.feed_later(seqs, tokens, offsets, feed)()

    def hypothesis_drafts(self, seqs: np.ndarray, contexts: np.ndarray,
                          context_len: np.ndarray, verified: np.ndarray, sound: np.ndarray,
                          max_tokens: np.ndarray, min_prob: np.ndarray, branches: int,
                          per_row: int, threads: int = 1) -> tuple:
        """The lookahead's hypotheses (:func:`vllm_rl.das.tree.hypothesis_drafts`) for rows
        drafting from the trees of their rollouts ``seqs`` (int64; -1 or unknown: no
        branches)."""
        return hypothesis_drafts(self.table,
                                 self._tree_index(np.asarray(seqs, dtype=np.int64)), contexts,
                                 context_len, verified, sound, max_tokens, min_prob, branches,
                                 per_row, threads)

    def _tree_index(self, seqs: np.ndarray) -> np.ndarray:
        """Each rollout's tree in the table (int32; -1: none, or an unknown id)."""
        tree_idx = np.full(len(seqs), -1, dtype=np.int32)
        known = (seqs >= 0) & (seqs < self._next_seq)
        tree_idx[known] = self._tree_of[seqs[known]]
        return tree_idx

    def lengths(self, problem_id: str) -> list[int]:
        p = self.problems.get(problem_id)
        return [n for n in p.lengths if n is not None] if p is not None else []

    def take_removals(self) -> list[tuple[SuffixTree, int]]:
        """The rollouts the windows dropped since the last call, still in their trees
        (``defer_removals``): pass them to :meth:`remove`."""
        out, self._doomed = self._doomed, []
        return out

    @staticmethod
    def remove(doomed: list[tuple[SuffixTree, int]]) -> None:
        """Take these rollouts out of their trees (each call releases the GIL).  A
        tree is a function of its rollouts, so when this runs does not change it."""
        for tree, seq in doomed:
            if seq in tree:
                tree.remove(seq)

    # ----------------------------------------------------------------- reporting
    def stats(self) -> dict:
        per = {}
        for pid, p in self.problems.items():
            per[pid] = {"rollouts": len(p.finished), "growing": len(p.growing),
                        "requests": p.requests, "tokens": p.tree.num_tokens(),
                        "bytes": p.tree.memory_bytes(), "drafted": p.drafted,
                        "accepted": p.accepted}
        return {"problems": len(self.problems), "stored_tokens": self.stored_tokens,
                "bytes": sum(v["bytes"] for v in per.values()), "per_problem": per}

    def sequences(self, problem_id: str) -> Iterable[list[int]]:
        p = self.problems.get(problem_id)
        if p is None:
            return []
        return [p.tree.sequence(s) for s in p.tree.sequences()]

    # ----------------------------------------------------------------- internals
    def _new_seq(self, problem_id: str) -> int:
        seq = self._next_seq
        self._next_seq += 1
        self._size[seq] = (problem_id, 0)
        if seq >= len(self._tree_of):        # 12 bytes per rollout ever started
            self._tree_of = np.concatenate([self._tree_of, np.full_like(self._tree_of, -1)])
            self._batched = np.concatenate([self._batched, np.zeros_like(self._batched)])
        return seq

    def _fold(self, seq: int) -> None:
        """A rollout stops growing: its batch-fed tokens join its size, it feeds no more."""
        if seq < len(self._tree_of):
            self._tree_of[seq] = -1
            n = int(self._batched[seq])
            if n:
                self._batched[seq] = 0
                pid, size = self._size.get(seq, (None, 0))
                if pid is not None:
                    self._size[seq] = (pid, size + n)

    def _grow(self, seq: int, n: int) -> None:
        pid, size = self._size[seq]
        self._size[seq] = (pid, size + n)
        self.stored_tokens += n

    def _finished(self, problem_id: str, p: Problem, seq: int, output_len: int | None) -> None:
        p.finished.append(seq)
        p.lengths.append(output_len)
        self._fifo.append(seq)
        while len(p.finished) > self.window:
            self._remove(problem_id, p, p.finished.popleft())
            p.lengths.popleft()
        while self.stored_tokens > self.max_stored_tokens and self._fifo:
            old = self._fifo.popleft()
            if old not in self._size:
                continue
            opid, _ = self._size[old]
            op = self.problems[opid]
            idx = op.finished.index(old)
            del op.finished[idx]
            del op.lengths[idx]
            self._remove(opid, op, old)
        if len(self._fifo) > 2 * len(self._size) + 1024:    # drop ids the window removed
            self._fifo = deque(s for s in self._fifo if s in self._size)
        self._drop_if_empty(problem_id, p)

    def _remove(self, problem_id: str, p: Problem, seq: int) -> None:
        _, n = self._size.pop(seq, (problem_id, 0))
        self.stored_tokens -= n
        if self.defer_removals:
            self._doomed.append((p.tree, seq))
        else:
            self.remove([(p.tree, seq)])
        self._drop_if_empty(problem_id, p)

    def _drop_if_empty(self, problem_id: str, p: Problem) -> None:
        if not p.finished and not p.growing and self.problems.get(problem_id) is p:
            del self.problems[problem_id]
            self.table.remove(p.index)


__all__ = ["ProblemTrees"]
