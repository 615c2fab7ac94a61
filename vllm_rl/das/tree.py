"""The suffix structure behind the DAS drafter (DAS, Sec. 4.1.2 "Adaptive nonparametric
drafter"; memory figure in the appendix "Scalability and System Overhead of Suffix Trees").

DAS drafts from a suffix tree built over a sliding window of recent rollouts, one tree per
problem: it finds the longest match between the current context and the tree, proposes a
multi-token draft along the most frequent continuation, and updates the tree online as
rollouts grow and old ones leave the window.  :class:`SuffixTree` is that index, written in
C++ (``csrc/suffix_tree.h`` documents the invariants):

* a compacted trie of every suffix of every stored sequence, cut to ``max_depth`` tokens,
  with occurrence counts; memory is O(stored tokens) (at most two nodes per token) and is
  returned exactly on removal;
* ``extend`` appends to a growing rollout in O(max_depth) per token, ``insert`` adds a
  finished one, ``finish`` seals a growing one, ``remove`` drops one (the sliding window);
* ``match`` finds the longest context suffix in the tree with O(log m) top-down probes of
  O(m) each (m = match length);
* ``draft`` continues the longest context suffix of length <= max(1, max_depth - b) along
  the most frequent child (ties: smallest token id) while the cumulative probability
  prod count(child)/(count(parent) + λ) stays >= ``min_prob``, up to b tokens (λ the
  tree's ``prior``, 0 unless set; inside an edge the factor is count/(count + λ));
* every call releases the GIL; ``draft_batch`` drafts for many contexts of one tree and
  :func:`draft_many` for many (tree, context) pairs (per-problem trees) in one call;
* :func:`feed_and_draft` is a whole drafter step in one call: every row appends its new
  tokens to its rollout, then every row drafts (per-row budget and ``min_prob``), from
  numpy arrays, with the trees named by index in a :class:`TreeTable`.

Example::

    tree = SuffixTree(max_depth=64)
    tree.insert(0, rollout_tokens)             # a finished rollout of this problem
    tree.extend(1, new_tokens)                 # a rollout still being generated
    tree.draft(context, max_tokens=8, min_prob=0.1)
    tree.remove(0)                             # slides out of the window
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from vllm_rl import _C

Draft = _C.Draft
UnknownSequenceError = _C.UnknownSequenceError
TreeTable = _C.TreeTable
draft_lists = _C.draft_lists


class SuffixTree(_C.SuffixTree):
    """Depth-bounded suffix tree over token-id sequences with occurrence counts (DAS Sec. 4.1.2).

    Args:
        max_depth: longest indexed substring, in tokens (1..65535).  A draft of ``b``
            tokens continues a context suffix of at most ``max(1, max_depth - b)`` tokens.
        prior: λ >= 0 added to each count a draft's probability divides by (default 0;
            1 is PPM's method A).

    Sequences are named by integer ids.  Methods (all release the GIL):

    * ``extend(seq_id, tokens)``: append to a growing sequence, creating it if new.
    * ``insert(seq_id, tokens)``: add a finished sequence (the id must be new).
    * ``finish(seq_id)``: seal a growing sequence (frees its append state).
    * ``remove(seq_id)``: drop a sequence; memory returns to what it was without it.
    * ``match(context) -> (match_len, count)``: longest context suffix in the tree and
      its number of occurrences.
    * ``count(pattern) -> int``: occurrences of a pattern of at most ``max_depth`` tokens.
    * ``draft(context, max_tokens, min_prob=0.1, backoff=False) -> list[int]``;
      ``draft_info`` returns a :class:`Draft` with per-token cumulative probabilities and
      the match.
    * ``draft_batch(contexts, max_tokens, min_prob=0.1) -> list[list[int]]`` with one
      budget or one per context (DAS Sec. 4.2 assigns budgets per request).
    * ``num_nodes()``, ``num_tokens()``, ``num_sequences()``, ``sequences()``,
      ``sequence(seq_id)``, ``is_growing(seq_id)``, ``seq_id in tree``,
      ``memory_bytes()``, ``check_invariants()``.

    Unknown ids raise :class:`UnknownSequenceError` (a ``KeyError``).
    """


def draft_many(trees, contexts, max_tokens, min_prob: float = 0.1,
               backoff: bool = False) -> list[list[int]]:
    """Draft ``contexts[i]`` from ``trees[i]`` for all i under one GIL release.

    DAS keeps one tree per problem (Sec. 4.1.2), so a decode step drafts for requests of
    many problems at once.  ``max_tokens`` is one budget or one per context.
    """
    return _C.draft_many(trees, contexts, max_tokens, min_prob, backoff)


class BatchDrafts(NamedTuple):
    """What :func:`feed_and_draft` returns: row ``i``'s draft is
    ``drafts[i, :lengths[i]]`` (int32); the CPU time (the calling thread's) of the feed
    and the draft phases."""

    drafts: np.ndarray
    lengths: np.ndarray
    feed_ns: int
    draft_ns: int

    def lists(self) -> list[list[int]]:
        """The drafts as ``list[list[int]]`` (vLLM's proposer return type), built in C++."""
        return draft_lists(self.drafts, self.lengths)


def feed_and_draft(trees, tree_idx, seq_ids, tokens, offsets, feed, contexts, context_len,
                   max_tokens, min_prob, backoff: bool = True) -> BatchDrafts:
    """One drafter step for many rows in one C++ call without the GIL (DAS Sec. 4.1.2:
    the trees are updated online and drafted from at every step).

    Row ``i`` uses ``trees[tree_idx[i]]`` (a :class:`TreeTable`, or a list of trees;
    a negative index skips the row).  First every row appends
    ``tokens[offsets[i]:offsets[i + 1]]`` (the first ``feed[i]`` of them, unless
    ``feed`` is None) to its growing sequence ``seq_ids[i]`` (created if new), exactly as
    ``tree.extend``; then every row with ``max_tokens[i] > 0`` drafts as
    ``tree.draft(contexts[i, :context_len[i]], max_tokens[i], min_prob[i], backoff)``.
    Every draft sees the whole step's feed.  numpy arrays with exact dtypes: int32
    ``tree_idx``, ``tokens``, ``feed``, ``contexts`` (2-D), ``context_len``,
    ``max_tokens``; int64 ``seq_ids``, ``offsets`` (rows + 1); float64 ``min_prob``.
    Bad arrays raise ``TypeError``/``ValueError`` before any tree changes.
    """
    return BatchDrafts(*_C.feed_and_draft(trees, tree_idx, seq_ids, tokens, offsets, feed,
                                          contexts, context_len, max_tokens, min_prob,
                                          backoff))


def hypothesis_drafts(trees, tree_idx, contexts, context_len, verified, sound, max_tokens, min_prob,
                      branches: int, per_row: int, threads: int = 1) -> tuple:
    """The lookahead's hypotheses for many rows in one C++ call without the GIL,
    assembled (:mod:`vllm_rl.das.hypotheses`).  Row ``i`` (``trees[tree_idx[i]]``; a
    negative index: none) with ``max_tokens[i] > 0`` verifies ``verified[i,
    :sound[i]]`` in the step on the device.  Its outcomes are ``(a, x)`` for each ``a``
    in 0 … ``sound[i]`` and ``x`` among the ``branches`` most frequent continuations of
    ``contexts[i, :context_len[i]] + verified[i, :a]``'s longest suffix that continues
    with a token other than ``verified[i, a]`` (when ``a < sound[i]``), ties to the
    smaller token as ``tree.draft``, each with the tree's chance (``a``'s from
    ``path_probs``, times ``x``'s share of those continuations).  Its ``per_row`` most
    likely outcomes (the more likely first; among equals the smaller ``a``, then the
    more frequent ``x``) are its hypotheses 0, 1, …, each followed by its draft of at
    most ``max_tokens[i]`` tokens at ``min_prob[i]`` (cumulative after the branch).
    Returns ``(lengths, tokens, drafts, branch_len, draft_len, fallback, ns)``: per row
    and hypothesis the tokens it assumes (``a + 1``; 0: none) and those tokens
    (``verified[i, :a]``, the branch), the draft after them (zero padded) and 1 + its
    length, each cut to the row's slots; per row those slots (while the chance of
    acceptance summed over its hypotheses, the outcome's chance times the draft's
    probability given it, is at least ``min_prob[i]``: :mod:`vllm_rl.das.hypotheses`)
    and its fallback (the most tokens assumed, the more likely among equals); ``ns``
    the call's CPU time, summed over its threads.  Up to ``threads`` threads share the
    rows (at least 64 drafting rows a thread); the output does not depend on how many.
    Exact dtypes as :func:`feed_and_draft` (int32 ``verified``, int64 ``sound``)."""
    return _C.hypothesis_drafts(trees, tree_idx, contexts, context_len, verified, sound, max_tokens,
                                min_prob, branches, per_row, threads)


__all__ = ["SuffixTree", "Draft", "UnknownSequenceError", "draft_many", "TreeTable",
           "BatchDrafts", "feed_and_draft", "draft_lists", "hypothesis_drafts"]
