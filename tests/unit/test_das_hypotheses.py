"""The lookahead's hypotheses (``vllm_rl.das.hypotheses``): the tree's branches
(``branch_drafts``) against a brute-force reference, and the device's choice of a
hypothesis against the host's (the same rule on both sides)."""
from __future__ import annotations

import random

import numpy as np
import pytest

from vllm_rl.das import hypotheses
from vllm_rl.das.tree import SuffixTree, TreeTable, branch_drafts


def _reference(tree: SuffixTree, context: list[int], exclude: int, branches: int, b: int,
               min_prob: float, alphabet: int) -> list[list[int]]:
    """By definition: the longest context suffix (<= D - b - 1, b < D) followed by some
    token other than ``exclude``; its ``branches`` most frequent such tokens (the
    smaller first among equals), each followed by the draft from the suffix and that
    token (as long as fits the depth)."""
    D = tree.max_depth
    b = min(b, D - 1)
    cap = max(D - b - 1, 1)
    for m in range(min(len(context), cap), 0, -1):
        suffix = context[-m:]
        counts = {t: tree.count(suffix + [t]) for t in range(alphabet) if t != exclude}
        counts = {t: c for t, c in counts.items() if c}
        if tree.count(suffix) and counts:
            top = sorted(counts, key=lambda t: (-counts[t], t))[:branches]
            room = min(b, D - m - 1)
            return [[t] + (tree.draft(suffix + [t], room, min_prob) if room else [])
                    for t in top]
    return []


def _branches(tree, contexts, exclude, b, min_prob, branches):
    n = len(contexts)
    width = max(1, max(len(c) for c in contexts))
    ctx = np.zeros((n, width), dtype=np.int32)
    for i, c in enumerate(contexts):
        ctx[i, :len(c)] = c
    out, lens, _ = branch_drafts([tree], np.zeros(n, np.int32), ctx,
                                 np.array([len(c) for c in contexts], np.int32),
                                 np.array(exclude, np.int32), np.full(n, b, np.int32),
                                 np.full(n, min_prob), branches)
    return [[out[i, j, :lens[i, j]].tolist() for j in range(branches) if lens[i, j]]
            for i in range(n)]


def test_branches_equal_the_reference():
    rng = random.Random(3)
    for trial in range(80):
        tree = SuffixTree(max_depth=rng.choice([8, 16, 32]))
        alphabet = rng.randint(2, 6)
        for s in range(rng.randint(1, 5)):
            tree.insert(s, [rng.randrange(alphabet) for _ in range(rng.randint(5, 60))])
        contexts = [[rng.randrange(alphabet) for _ in range(rng.randint(1, 30))]
                    for _ in range(6)]
        exclude = [rng.choice([-1, *range(alphabet)]) for _ in contexts]
        b, p, branches = rng.choice([0, 1, 3, 8]), rng.choice([0.0, 0.1, 0.5]), rng.randint(1, 3)
        got = _branches(tree, contexts, exclude, b, p, branches)
        for i, c in enumerate(contexts):
            assert got[i] == _reference(tree, c, exclude[i], branches, b, p, alphabet), \
                (trial, i)


def test_hand_example():
    """Three rollouts after (1, 2, 3): 4 twice, 9 once.  The branches by count, the
    excluded token skipped, and a context whose only continuation is excluded backs off
    until another one exists (here none: no branch)."""
    tree = SuffixTree(32)
    for s, x in enumerate([[1, 2, 3, 4, 5], [1, 2, 3, 9, 9], [1, 2, 3, 4, 6], [7, 2, 3, 8]]):
        tree.insert(s, x)
    got = _branches(tree, [[1, 2, 3], [1, 2, 3], [1, 2, 3], [1, 2]], [-1, 4, 9, 3], 4, 0.0, 3)
    assert got == [[[4, 5], [9, 9]], [[9, 9]], [[4, 5]], []]
    # one token of the draft after the branch: ties go to the smaller token (5 before 6)
    assert _branches(tree, [[2, 3]], [-1], 4, 0.0, 3) == [[[4, 5], [8], [9, 9]]]


def test_bad_arguments():
    table = TreeTable()
    table.add(SuffixTree(8))
    ctx = np.zeros((1, 2), np.int32)
    args = (np.array([2], np.int32), np.array([-1], np.int32), np.array([2], np.int32),
            np.array([0.1]))
    with pytest.raises(ValueError, match="branches"):
        branch_drafts(table, np.array([0], np.int32), ctx, *args, 0)
    with pytest.raises(ValueError, match="names no tree"):
        branch_drafts(table, np.array([3], np.int32), ctx, *args, 2)
    with pytest.raises(TypeError):
        branch_drafts(table, np.array([0], np.int64), ctx, *args, 2)


def test_accepted_counts_are_none_one_and_all():
    i, a = hypotheses.accepted_counts(np.array([0, 1, 2, 5]))
    assert list(zip(i.tolist(), a.tolist())) == [(0, 0), (1, 0), (1, 1), (2, 0), (2, 1),
                                                 (2, 2), (3, 0), (3, 1), (3, 5)]


def test_contexts_and_assemble():
    """A row verifying drafts (5, 6) in the step on the device has three outcomes to
    hypothesise: none, one or both accepted; the token after a rejected draft is not
    that draft."""
    ctx = np.array([[1, 2, 0], [3, 0, 0]], np.int32)
    d = np.array([[5, 6, 0], [0, 0, 0]], np.int32)
    k = np.array([2, 0])
    row, a, out, out_len, exclude = hypotheses.contexts(ctx, np.array([2, 1], np.int32), d, k,
                                                         np.array([0, 1]))
    assert row.tolist() == [0, 0, 0, 1] and a.tolist() == [0, 1, 2, 0]
    assert [out[i, :n].tolist() for i, n in enumerate(out_len)] == \
        [[1, 2], [1, 2, 5], [1, 2, 5, 6], [3]]
    assert exclude.tolist() == [5, 6, -1, -1]
    # two branches per pair: (token, draft...)
    br = np.zeros((4, 2, 3), np.int32)
    lens = np.zeros((4, 2), np.int32)
    for p, rows in enumerate([[[7, 8, 9]], [[8, 9]], [[10], [11, 12]], [[4, 4, 4]]]):
        for j, x in enumerate(rows):
            br[p, j, :len(x)] = x
            lens[p, j] = len(x)
    hyp = hypotheses.assemble(2, 3, row, a, d, br, lens)
    assert hyp.lengths.tolist() == [[1, 0, 2, 0, 3, 3], [1, 0, 0, 0, 0, 0]]
    assert hyp.tokens[0, 4].tolist() == [5, 6, 10, 0] and hyp.tokens[0, 5].tolist() == [5, 6, 11, 0]
    assert hyp.drafts[0, 0].tolist() == [8, 9, 0] and hyp.drafts[0, 5].tolist() == [12, 0, 0]
    assert hyp.draft_len.tolist() == [2, 2]
    assert hyp.fallback.tolist() == [4, 0]           # both accepted, the first branch
    # the host's rule: the first hypothesis the sampled tokens equal (-1 padded)
    sampled = np.array([[5, 8, -1], [4, -1, -1]])
    assert hypotheses.match(sampled, np.array([2, 1]), hyp).tolist() == [2, 0]
    assert hypotheses.match(np.array([[5, 6, 12], [3, -1, -1]]), np.array([3, 1]),
                            hyp).tolist() == [-1, -1]


def test_device_selection_equals_the_host_rule():
    """The drafts the device takes are those of the hypothesis the host finds, or the
    fallback's; a discarded row (a prefill chunk) matches none."""
    import torch

    rng = np.random.default_rng(0)
    for _ in range(50):
        n, H, k = rng.integers(1, 9), rng.integers(1, 7), rng.integers(1, 5)
        hyp = hypotheses.Hypotheses(
            lengths=rng.integers(0, k + 2, size=(n, H)).astype(np.int32),
            tokens=rng.integers(0, 3, size=(n, H, k + 1)).astype(np.int32),
            drafts=rng.integers(0, 50, size=(n, H, k)).astype(np.int32),
            draft_len=np.zeros(n, np.int32), fallback=rng.integers(0, H, size=n))
        width = int(rng.integers(1, k + 2))
        counts = rng.integers(1, width + 1, size=n)
        sampled = np.where(np.arange(width) < counts[:, None],
                           rng.integers(0, 3, size=(n, width)), -1)
        discard = rng.random(n) < 0.2
        hyp.without(discard)
        host = hypotheses.match(sampled, np.where(discard, 0, counts), hyp)
        dev = hypotheses.select_on_device(
            torch.from_numpy(sampled),
            tuple(torch.from_numpy(x) for x in (hyp.lengths, hyp.tokens, hyp.drafts,
                                                hyp.fallback)))
        want = hyp.drafts[np.arange(n), np.where(host >= 0, host, hyp.fallback)]
        assert np.array_equal(dev.numpy(), want)
        assert not (host[discard] >= 0).any()
