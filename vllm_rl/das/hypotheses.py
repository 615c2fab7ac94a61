"""The lookahead's hypotheses: step n + 1's drafts for each way step n may come out.

Under async scheduling the DAS drafter drafts step n + 1 while step n runs
(:mod:`.async_drafts`), before step n's tokens are known.  A row that verifies k drafts
d_1 … d_k in step n samples a + 1 tokens: the first a drafts accepted (0 ≤ a ≤ k) and one
more token x.  For a < k, x is not d_{a+1}: vLLM's rejection sampler draws the token
after a rejected draft from the target distribution with the draft's token removed (the
residual max(p − q, 0) of a one-token proposal q).  So the row's context after step n
is one of

    context + d_1 … d_a + x,     0 ≤ a ≤ k,  x ≠ d_{a+1} when a < k.

The outcomes are the pairs (a, x) for a in 0 … k and x among the ``branches`` most
frequent continuations of ``context + d_1 … d_a`` in the row's tree other than d_{a+1}
(``SuffixTree.branch_points``), each with the tree's chance P(a) · P(x | a) (below).
Where the longest suffix that continues has fewer (often a suffix seen once, with its
one continuation), each shorter suffix adds its continuations not found yet, as PPM's
method A with exclusion backs off (Cleary & Witten 1984): the longer suffixes leave
λ / (total + λ) each to tokens they have not seen.  A
row's hypotheses are its H most likely outcomes, each with the tree's draft after it:
one C++ call for the step builds them all (:func:`build`).  H is
``DASConfig.hypotheses``, or with ``DASConfig.step_hypotheses`` > 0 the step's share of
it among its drafting rows, at least ``hypotheses`` and at most :data:`MOST_PER_ROW`
(:func:`most_likely`).  All of a row's hypotheses go to the device; once step n has
sampled, the device takes, per row, the first
hypothesis equal to its sampled tokens (:func:`select_on_device`) before vLLM's input
preparation reads the drafts, so nothing waits on the host.  Where none matches, the row
verifies the draft of its fallback, the hypothesis that assumes the most accepted
drafts (every draft accepted, the zero-bubble assumption of vllm#32951, where it is
among them) with the tree's next token: a proposal made on a wrong context, which the
rejection sampler rejects or accepts on its merits (lossless for any proposal).  The
host learns which draft was verified when step n's tokens reach it (:func:`match`, the
same rule).

A row verifies the same L draft slots whichever hypothesis the device takes (the
scheduler output is fixed before step n's tokens exist), so a slot pays by the chance
that it is accepted, summed over the hypotheses, at most one of which holds:

    P(slot u accepted) = Σ_h P(a_h) · P(x_h | a_h) · c_h(u),

c_h(u) the tree's cumulative probability of h's draft through its u-th token given h
(Sec. 4.1's count ratios, from 1).  P(a) = q_1 … q_a (1 − q_{a+1}) for a < k and
q_1 … q_k for a = k, q_j the tree's probability of d_j after the context and d_1 …
d_{j−1} (``SuffixTree.path_probs``); P(x | a) is x's count among the continuations
other than d_{a+1}, over their total plus the tree's λ (with λ = 0 a tree that has
seen only d_{a+1} there gives the outcome chance 0), and for an x of a shorter suffix
its count among that suffix's continuations not found before, over their total plus
λ, times λ / (total + λ) of each longer suffix searched.  L is the number of leading slots
whose chance reaches the row's cutoff: the rule by which the confidence cap
(:mod:`.draft_lengths`) prices drafts, a slot's acceptance against its price.  Each
hypothesis drafts while c_h stays at the cutoff (a token below it adds less than the
cutoff to any slot's sum) and is cut to L.  Taking the largest single term instead of
the sum verified fewer slots and was slower with DUET and ARRoL
(``docs/benchmarks.md``, "The slots priced by the sum over the hypotheses").

The drafts of step n + 1 are the drafts synchronous scheduling would make whenever step
n's outcome is among the hypotheses, cut to the row's slots: the acceptance the lookahead
loses is the share of outcomes outside them (``docs/benchmarks.md``, "DAS's
lookahead").

Why the most likely outcomes: a suffix-tree draft tends to be right to its end or wrong
at once (over one 16 × 8 rollout step the rows verifying 4 drafts accepted 0 of them
68% of the time, 1 13%, 2 5%, 3 4%, all 4 10%), but at the tail of a step, where its
few longest samples decide its length, the counts between are the misses that cost
(``docs/benchmarks.md``, "The most likely outcomes").  Ranking every count's next
tokens by their chance keeps the outcomes that hold most rows at a bounded tree work.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class Hypotheses:
    """A step's hypotheses, per row of the step in flight: ``lengths[i, h]`` sampled
    tokens assumed (a + 1; 0: no hypothesis ``h``), ``tokens[i, h]`` those tokens (d_1 …
    d_a, x), then -1 as vLLM pads a row's sampled ids (so a hypothesis equals a row's
    sampled ids, padding included, exactly when they bear it out; a cell without one
    starts with -2, which no sampled id equals), ``drafts[i, h]`` the draft made after
    them (zero padded), ``draft_len[i]`` the draft slots the row verifies (L, module docstring),
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
            rows = rows[:len(self.lengths)]
            self.lengths[rows] = 0
            self.tokens[rows, :, 0] = -2
        return self

    def fallback_drafts(self) -> np.ndarray:
        """Each row's fallback draft, ``[rows, k_max]``."""
        return np.ascontiguousarray(self.drafts[np.arange(len(self.fallback)), self.fallback])


MOST_PER_ROW = 64      # the most hypotheses a row gets (DASConfig.step_hypotheses)


def most_likely(rows: int, least: int, per_step: int) -> int:
    """How many of its most likely outcomes each row of a step with ``rows`` drafting
    rows gets: ``per_step`` shared among them, at least ``least`` and at most
    :data:`MOST_PER_ROW`; ``least`` alone when ``per_step`` is 0 (the default).  Each
    hypothesis is one tree draft: a full batch, whose host time can exceed its forward
    pass, can keep few; a narrow step, whose forward pass costs as much at one token a
    row as at nine, all."""
    return max(least, min(MOST_PER_ROW, per_step // max(rows, 1)))


def per_row(k: np.ndarray, branches: int, most: int) -> int:
    """H, the hypotheses per row of a step whose drafting rows verify ``k`` sound drafts
    each in the step on the device: the ``most`` likely outcomes, or all of them where a
    row has fewer (k + 1 counts × ``branches`` next tokens), for the row with the most."""
    return min(most, (int(k.max()) + 1 if len(k) else 1) * branches)


def build(store, seqs: np.ndarray, contexts: np.ndarray, context_len: np.ndarray,
          d: np.ndarray, k: np.ndarray, max_tokens: np.ndarray, min_prob: np.ndarray,
          branches: int, most: int, threads: int = 1) -> tuple[Hypotheses, int]:
    """A step's hypotheses in one C++ call (:meth:`vllm_rl.das.store.ProblemTrees.hypothesis_drafts`):
    each row with ``max_tokens > 0``, of rollout ``seqs`` (its tree) and context
    ``contexts[i, :context_len[i]]``, verifying ``d[i, :k[i]]`` in the step on the device:
    of the outcomes (a, x), a in 0 … k[i] and x among the ``branches`` most frequent next
    tokens after ``context + d_1 … d_a`` other than d_{a+1} (shorter suffixes filling in,
    module docstring; at most ``most`` a count), the ``most`` likely, each
    with its draft, on up to ``threads`` threads (the same output).  Returns the
    hypotheses and the call's CPU time (ns)."""
    H = per_row(k[max_tokens > 0], branches, most)
    lengths, tokens, drafts, _, draft_len, fallback, ns = store.hypothesis_drafts(
        seqs, contexts, context_len, np.ascontiguousarray(d, dtype=np.int32),
        np.ascontiguousarray(k, dtype=np.int64), max_tokens.astype(np.int32),
        np.ascontiguousarray(min_prob, dtype=np.float64), branches, H, threads)
    return Hypotheses(lengths, tokens, drafts, draft_len, fallback), ns


def match(sampled: np.ndarray, hyp: Hypotheses) -> np.ndarray:
    """Per row: the first hypothesis equal to its sampled ids (``[rows, k + 1]``, -1
    past a row's tokens), -1 where none is (:func:`select_on_device`'s rule, on the
    host).  A hypothesis assumes at most k + 1 tokens (k: the drafts its row verifies
    in that step), so comparing the sampled width compares it whole."""
    return _first_match(sampled, hyp.tokens)


def _first_match(sampled: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """:func:`match` on the hypotheses' tokens (``[rows, H, k + 1]``)."""
    n = tokens.shape[0]
    w = min(sampled.shape[1], tokens.shape[2])
    ok = (sampled[:n, None, :w] == tokens[:, :, :w]).all(axis=2)
    return np.where(ok.any(axis=1), ok.argmax(axis=1), -1)


TALLY = ("rows", "matched", "count_missed", "token_missed", "next_token_rows",
         "next_token_matched")


def tally(sampled: np.ndarray, hyp: Hypotheses, matched: np.ndarray, totals: dict) -> None:
    """Add a step's outcomes to ``totals`` (keys :data:`TALLY`; ``sampled`` and
    ``matched`` by the hypotheses' rows, as :func:`match` takes them): its rows with
    hypotheses, those that bore one out (``matched``, :func:`match`), those whose
    accepted count a was not hypothesised, those whose count was but not the token x
    after it; and the rows whose hypotheses all assume one sampled token, a guess of the
    next token only (``next_token_rows``: a row that verified no sound draft in the
    step, or whose other counts the tree does not continue), and of those matched."""
    has = (hyp.lengths > 0).any(axis=1)
    hit = matched >= 0
    counted = (hyp.lengths == (sampled >= 0).sum(axis=1)[:, None]).any(axis=1)
    bare = has & (hyp.lengths.max(axis=1) == 1)
    for key, rows in zip(TALLY, (has, hit, has & ~counted, has & counted & ~hit, bare,
                                 bare & hit)):
        totals[key] += int(rows.sum())


def select_on_device(sampled: Any, hyp: Any) -> Any:
    """Each row's draft for the next step, on the device, from step n's ``sampled`` ids
    (``[rows, k + 1]``, -1 past a row's tokens) and the hypotheses uploaded
    (``(tokens, drafts, fallback)`` device tensors; a row whose sample does not count,
    a prefill chunk, has none: :meth:`Hypotheses.without`): the first hypothesis equal
    to the row's sampled ids (:func:`match`), else its fallback.  No host sync: the
    ops queue behind step n's sampling.  On vLLM's CPU platform the device is this
    host, and the same rule runs in NumPy (:func:`match`), outside torch's OpenMP
    pool: in the engine at 1,024 rows the torch ops took about 2 ms a step (py-spy),
    against 0.2–0.4 ms for the same ops alone, with the feeder thread on the other
    core."""
    import torch

    tokens, drafts, fallback = hyp
    if tokens.device.type == "cpu":
        d = drafts.numpy()
        idx = _first_match(sampled.numpy(), tokens.numpy())
        idx = np.where(idx >= 0, idx, fallback.numpy())
        return torch.from_numpy(d[np.arange(len(d)), idx])
    return _select_torch(sampled, tokens, drafts, fallback)


def _select_torch(sampled: Any, tokens: Any, drafts: Any, fallback: Any) -> Any:
    """:func:`select_on_device` in torch ops, for an accelerator."""
    import torch

    n = tokens.shape[0]
    w = min(sampled.shape[1], tokens.shape[2])
    ok = (sampled[:n, None, :w] == tokens[:, :, :w]).all(dim=2)
    idx = torch.where(ok.any(dim=1), ok.int().argmax(dim=1), fallback)
    return drafts[torch.arange(n, device=tokens.device), idx]


__all__ = ["MOST_PER_ROW", "TALLY", "Hypotheses", "build", "match", "most_likely",
           "per_row", "select_on_device", "tally"]
