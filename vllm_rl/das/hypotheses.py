"""The lookahead's hypotheses: step n + 1's drafts for each way step n may come out.

Under async scheduling the DAS drafter drafts step n + 1 while step n runs
(:mod:`.async_drafts`), before step n's tokens are known.  A row that verifies k drafts
d_1 … d_k in step n samples a + 1 tokens: the first a drafts accepted (0 ≤ a ≤ k) and one
more token x.  For a < k, x is not d_{a+1}: vLLM's rejection sampler draws the token
after a rejected draft from the target distribution with the draft's token removed (the
residual max(p − q, 0) of a one-token proposal q).  So the row's context after step n
is one of

    context + d_1 … d_a + x,     0 ≤ a ≤ k,  x ≠ d_{a+1} when a < k.

Each hypothesis is one (a, x) for a in 0, 1 and k (none, one or every draft accepted:
the outcomes that hold most rows, below; :func:`accepted_counts`), x among the ``branches`` most
frequent continuations of ``context + d_1 … d_a`` in the row's tree other than d_{a+1}
(``SuffixTree.branch_into``), with the tree's draft after it.  All of a row's hypotheses
go to the device; once step n has sampled, the device takes, per row, the first
hypothesis equal to its sampled tokens (:func:`select_on_device`) before vLLM's input
preparation reads the drafts, so nothing waits on the host.  Where none matches, the row
verifies the draft of its fallback, the hypothesis that every draft was accepted (the
zero-bubble assumption of vllm#32951) with the tree's next token: a proposal made on a
wrong context, which the rejection sampler rejects or accepts on its merits (lossless
for any proposal).  The
host learns which draft was verified when step n's tokens reach it (:func:`match`, the
same rule).

The drafts of step n + 1 are exactly the drafts synchronous scheduling would make
whenever step n's outcome is among the hypotheses: the acceptance the lookahead loses is
the share of outcomes outside them (``docs/benchmarks.md``, "DAS's lookahead").

Why none, one or all: a suffix-tree draft tends to be right to its end or wrong at once.
Over one 16 × 8 rollout step on the embedded model (the rows verifying 4 drafts: 3,030
verifications), the accepted count was 0 for 68%, 1 for 13%, 2 for 5%, 3 for 4% and all
4 for 10%; with 5 drafts 61%, 21%, 3%, 5%, 1% and 8%.  The three counts keep about 90%
of the rows at a third of the tree work of every count.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class Hypotheses:
    """A step's hypotheses, per row of the step in flight: ``lengths[i, h]`` sampled
    tokens assumed (a + 1; 0: no hypothesis ``h``), ``tokens[i, h, :lengths[i, h]]``
    those tokens (d_1 … d_a, x), ``drafts[i, h]`` the draft made after them (zero
    padded), ``draft_len[i]`` the draft length the row verifies (its longest),
    ``fallback[i]`` the hypothesis it verifies when none matches (the most accepted
    drafts, the tree's next token)."""

    lengths: np.ndarray          # [rows, H] int32
    tokens: np.ndarray           # [rows, H, k_max + 1] int32
    drafts: np.ndarray           # [rows, H, k_max] int32
    draft_len: np.ndarray        # [rows] int32
    fallback: np.ndarray         # [rows] int64

    def without(self, rows: np.ndarray) -> "Hypotheses":
        """No hypothesis for ``rows`` (a bool mask: rows whose sample is discarded,
        which nothing can match)."""
        if rows.any():
            self.lengths[rows[:len(self.lengths)]] = 0
        return self

    def fallback_drafts(self) -> np.ndarray:
        """Each row's fallback draft, ``[rows, k_max]``."""
        return np.ascontiguousarray(self.drafts[np.arange(len(self.fallback)), self.fallback])


def accepted_counts(k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row with ``k[i]`` drafts in the step on the device, the accepted counts
    hypothesised (0, 1 and k, each once), rows in order: (row index into ``k``, a) per
    pair."""
    k = np.asarray(k, dtype=np.int64)
    cand = np.stack([np.zeros_like(k), np.minimum(k, 1), k], axis=1)     # 0, 1, k
    keep = np.ones(cand.shape, dtype=bool)
    keep[:, 1] = k >= 1
    keep[:, 2] = k >= 2
    i, j = np.nonzero(keep)
    return i, cand[i, j]


def contexts(contexts: np.ndarray, context_len: np.ndarray, d: np.ndarray, k: np.ndarray,
             rows: np.ndarray):
    """The hypotheses' contexts for ``rows``: per row ``r`` and a in 0, 1 and k[r]
    (:func:`accepted_counts`), the row's context followed by d[r, :a], and the token its
    next one may not be (d[r, a] when a < k[r], else -1).  Returns (row, a, contexts,
    context_len, exclude) per pair, a row's pairs together."""
    i, a = accepted_counts(k[rows])
    row = rows[i]
    width, k_max = contexts.shape[1], d.shape[1]
    out = np.zeros((len(row), width + k_max), dtype=np.int32)
    out[:, :width] = contexts[row]
    base = context_len[row].astype(np.int64)
    p, j = np.nonzero(np.arange(k_max) < a[:, None])
    out[p, base[p] + j] = d[row[p], j]
    exclude = np.where(a < k[row], d[row, np.minimum(a, k_max - 1)], -1).astype(np.int32)
    return row, a, out, (base + a).astype(np.int32), exclude


def assemble(n: int, k_max: int, row: np.ndarray, a: np.ndarray, d: np.ndarray,
             out: np.ndarray, lens: np.ndarray) -> Hypotheses:
    """The hypotheses of ``n`` rows from the branch drafts of their (row, a) pairs, a
    row's pairs together (``out[p, j]``: branch j of pair p and its draft, ``lens[p,
    j]`` tokens): hypothesis s · B + j of row ``row[p]``, p its s-th pair, assumes
    d[row, :a] then branch j."""
    branches = lens.shape[1] if lens.ndim == 2 else 1
    first = np.r_[True, row[1:] != row[:-1]] if len(row) else np.zeros(0, bool)
    starts = np.flatnonzero(first)
    slot = np.arange(len(row)) - np.repeat(starts, np.diff(np.r_[starts, len(row)]))
    H = (int(slot.max()) + 1 if len(row) else 1) * branches
    lengths = np.zeros((n, H), dtype=np.int32)
    tokens = np.zeros((n, H, k_max + 1), dtype=np.int32)
    drafts = np.zeros((n, H, k_max), dtype=np.int32)
    draft_len = np.zeros(n, dtype=np.int32)
    if len(row):
        h = slot[:, None] * branches + np.arange(branches)        # [P, B]
        r = np.broadcast_to(row[:, None], h.shape)
        some = lens > 0
        lengths[r, h] = np.where(some, a[:, None] + 1, 0)
        prefix = np.where(np.arange(k_max) < a[:, None], d[row], 0)   # [P, k_max]
        tokens[r, h, :k_max] = prefix[:, None, :]
        tokens[r, h, np.broadcast_to(a[:, None], h.shape)] = np.where(some, out[:, :, 0], 0)
        w = min(out.shape[2] - 1, k_max)
        if w > 0:
            body = out[:, :, 1:1 + w]
            body = np.where(np.arange(w) < (lens[:, :, None] - 1), body, 0)
            drafts[r, h, :w] = body
        np.maximum.at(draft_len, row, np.maximum(lens - 1, 0).max(axis=1).astype(np.int32))
    # the fallback: the most tokens assumed, the first branch among equals
    score = np.where(lengths > 0, lengths.astype(np.int64) * H - np.arange(H) % branches, -1)
    return Hypotheses(lengths, tokens, drafts, draft_len, score.argmax(axis=1))


def match(sampled: np.ndarray, counts: np.ndarray, hyp: Hypotheses) -> np.ndarray:
    """Per row: the first hypothesis equal to its sampled tokens (``sampled[i,
    :counts[i]]``), -1 where none is (:func:`select_on_device`'s rule, on the host)."""
    w = min(sampled.shape[1], hyp.tokens.shape[2])
    j = np.arange(w)
    eq = (sampled[:, None, :w] == hyp.tokens[:, :, :w]) | (j >= hyp.lengths[:, :, None])
    ok = eq.all(axis=2) & (hyp.lengths == counts[:, None]) & (hyp.lengths > 0)
    return np.where(ok.any(axis=1), ok.argmax(axis=1), -1)


def select_on_device(sampled: Any, hyp: Any) -> Any:
    """Each row's draft for the next step, on the device, from step n's ``sampled`` ids
    (``[rows, k + 1]``, -1 past a row's tokens) and the hypotheses uploaded
    (``(lengths, tokens, drafts, fallback)`` device tensors; a row whose sample does
    not count, a prefill chunk, has none: :meth:`Hypotheses.without`): the first
    hypothesis equal to the row's sampled tokens, else its fallback.  No host sync:
    the ops queue behind step n's sampling."""
    import torch

    lengths, tokens, drafts, fallback = hyp
    n = lengths.shape[0]
    s = sampled[:n]
    w = min(s.shape[1], tokens.shape[2])
    counts = (s >= 0).sum(dim=1)
    j = torch.arange(w, device=s.device)
    eq = (s[:, None, :w] == tokens[:, :, :w]) | (j >= lengths[:, :, None])
    ok = eq.all(dim=2) & (lengths == counts[:, None]) & (lengths > 0)
    idx = torch.where(ok.any(dim=1), ok.int().argmax(dim=1), fallback)
    return drafts[torch.arange(n, device=s.device), idx].contiguous()


__all__ = ["Hypotheses", "accepted_counts", "assemble", "contexts", "match",
           "select_on_device"]
