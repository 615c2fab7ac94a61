"""The lookahead's hypotheses (``vllm_rl.das.hypotheses``): the one C++ call that builds
them (``tree.hypothesis_drafts``) against a brute-force reference, its branches and their
layout, and the device's choice of a hypothesis against the host's (the same rule on
both sides)."""
from __future__ import annotations

import random

import numpy as np
import pytest

from vllm_rl.das import hypotheses
from vllm_rl.das.tree import SuffixTree, TreeTable
from vllm_rl.das.tree import hypothesis_drafts


def _reference(tree: SuffixTree, context: list[int], exclude: int, branches: int, b: int,
               min_prob: float, alphabet: int) -> list[tuple]:
    """By definition: the longest context suffix (<= D - b - 1, b < D) followed by some
    token other than ``exclude``; its ``branches`` most frequent such tokens (the
    smaller first among equals), each with its share of the continuations other than
    ``exclude`` (count / (their total + λ)); while fewer than ``branches``, the next
    shorter suffix with a continuation not found yet adds its most frequent such tokens,
    each with its share among the continuations not found times the escape of the
    longer suffixes (λ / (total + λ) each: PPM's method A with exclusion).  Each token
    with its draft from its suffix and that token (as long as fits the depth), the
    draft's cumulative probabilities given the token, and its share."""
    D = tree.max_depth
    b = min(b, D - 1)
    cap = max(D - b - 1, 1)
    found, escape = [], 1.0
    for m in range(min(len(context), cap), 0, -1):
        suffix = context[-m:]
        skip = {exclude} | {t for t, _, _ in found}
        counts = {t: tree.count(suffix + [t]) for t in range(alphabet) if t not in skip}
        counts = {t: c for t, c in counts.items() if c}
        if not tree.count(suffix) or not counts:
            continue
        total = tree.count(suffix) - sum(tree.count(suffix + [t]) for t in skip if t >= 0)
        top = sorted(counts, key=lambda t: (-counts[t], t))[:branches - len(found)]
        found += [(t, m, escape * counts[t] / (total + tree.prior)) for t in top]
        escape *= tree.prior / (total + tree.prior)
        if len(found) >= branches or not escape:
            break
    return [(t, *_draft(tree, context[-m:] + [t], min(b, D - m - 1), min_prob, alphabet),
             share) for t, m, share in found]


def _draft(tree, s, room, min_prob, alphabet):
    """The most frequent continuation of ``s`` (the smaller token among equals) while its
    cumulative probability stays >= ``min_prob``: count / (context's + λ).  Returns the
    tokens and their cumulative probabilities."""
    out, probs, prob = [], [], 1.0
    while len(out) < room:
        counts = {t: tree.count(s + [t]) for t in range(alphabet)}
        counts = {t: c for t, c in counts.items() if c}
        if not counts:
            break
        t = min(counts, key=lambda t: (-counts[t], t))
        p = prob * (counts[t] / (tree.count(s) + tree.prior))
        if p < min_prob:
            break
        prob = p
        out.append(t)
        probs.append(p)
        s = s + [t]
    return out, probs


def _call(trees, tree_idx, contexts, d, k, b, min_prob, branches, most=64, threads=1):
    """``tree.hypothesis_drafts`` on lists: row i's context ``contexts[i]``, verifying
    ``d[i][:k[i]]``, drafting ``b[i]`` tokens; the ``most`` likely outcomes a row, on at
    most ``threads`` threads."""
    n = len(contexts)
    width = max(1, max(len(c) for c in contexts))
    ctx = np.zeros((n, width), dtype=np.int32)
    for i, c in enumerate(contexts):
        ctx[i, :len(c)] = c
    K = max(1, max(len(x) for x in d), max(b))
    ver = np.zeros((n, K), dtype=np.int32)
    for i, x in enumerate(d):
        ver[i, :len(x)] = x
    k = np.array(k, np.int64)
    b = np.array(b, np.int32)
    return hypothesis_drafts(trees, np.array(tree_idx, np.int32), ctx,
                             np.array([len(c) for c in contexts], np.int32), ver, k, b,
                             np.full(n, min_prob), branches,
                             hypotheses.per_row(k[b > 0], branches, most), threads)


def _branches(tree, contexts, exclude, b, min_prob, branches):
    """Each context's branches (token, then its draft) other than ``exclude``: the
    hypotheses of none accepted (most frequent first) of a row that verifies the one
    draft ``exclude`` (none where it is < 0)."""
    n = len(contexts)
    d = [[e] if e >= 0 else [] for e in exclude]
    lengths, tokens, drafts, blen, _, _, _ = _call([tree], [0] * n, contexts, d,
                                                   [len(x) for x in d], [b] * n, min_prob,
                                                   branches)
    return [[[int(tokens[i, j, 0]), *drafts[i, j, :blen[i, j] - 1].tolist()]
             for j in range(lengths.shape[1]) if lengths[i, j] == 1] for i in range(n)]


def test_branches_equal_the_reference():
    rng = random.Random(3)
    for trial in range(80):
        tree = SuffixTree(max_depth=rng.choice([8, 16, 32]),
                          prior=rng.choice([0.0, 0.5, 1.0, 3.0]))
        alphabet = rng.randint(2, 6)
        for s in range(rng.randint(1, 5)):
            tree.insert(s, [rng.randrange(alphabet) for _ in range(rng.randint(5, 60))])
        contexts = [[rng.randrange(alphabet) for _ in range(rng.randint(1, 30))]
                    for _ in range(6)]
        exclude = [rng.choice([-1, *range(alphabet)]) for _ in contexts]
        b, p, branches = rng.choice([1, 3, 8]), rng.choice([0.0, 0.1, 0.5]), rng.randint(1, 3)
        got = _branches(tree, contexts, exclude, b, p, branches)
        for i, c in enumerate(contexts):
            # the row verifies [exclude] (the branches follow its rejection), and its
            # slots are paid by both of its counts' hypotheses
            k = int(exclude[i] >= 0)
            d = ([exclude[i]] * k + [0] * b)[:b]
            H = hypotheses.per_row(np.array([k]), branches, 64)
            lengths, tokens, _, _, own = _reference_hypotheses(tree, c, d, k, b, p, branches,
                                                              alphabet, H)
            want = [[tokens[j][0], *own[j]] for j in range(H) if lengths[j] == 1]
            assert got[i] == want, (trial, i)


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
    # a slot is verified while its chance of acceptance summed over the hypotheses
    # reaches the cutoff: 4 (2/3) then 5 (1/2 after 4), 9 (1/3) then 9 (1): slot 1 is
    # accepted with 2/3 * 1/2 + 1/3 * 1 = 2/3, slot 2 with nothing (no draft reaches it)
    assert _branches(tree, [[1, 2, 3]], [-1], 4, 0.45, 3) == [[[4, 5], [9, 9]]]
    # a draft token below the cutoff given its own branch is not drafted (5 after 4)
    assert _branches(tree, [[1, 2, 3]], [-1], 4, 0.6, 3) == [[[4], [9]]]


def test_shorter_suffixes_fill_the_branches():
    """Where the longest suffix has fewer continuations than ``branches``, shorter
    suffixes add theirs (PPM's escape with exclusion; λ = 1): after (1, 2, 3), 4 (2/4) and
    9 (1/4), then 8, seen after (2, 3) only, with the escape 1/4 times its share 1/2 of
    the continuations of (2, 3) other than 4 and 9.  With λ = 0 nothing escapes."""
    rollouts = [[1, 2, 3, 4, 5], [1, 2, 3, 9, 9], [1, 2, 3, 4, 6], [7, 2, 3, 8]]
    for prior, want in ((1.0, [[4, 5], [9, 9], [8]]), (0.0, [[4, 5], [9, 9]])):
        tree = SuffixTree(32, prior=prior)
        for s, x in enumerate(rollouts):
            tree.insert(s, x)
        assert _branches(tree, [[1, 2, 3]], [-1], 4, 0.0, 3) == [want]
        shares = [(t, share) for t, *_, share in _reference(tree, [1, 2, 3], -1, 3, 4, 0.0, 10)]
        assert shares == [(4, 0.5), (9, 0.25), (8, 0.125)] if prior else [(4, 2 / 3), (9, 1 / 3)]


def test_bad_arguments():
    table = TreeTable()
    table.add(SuffixTree(8))
    ctx = np.zeros((1, 2), np.int32)
    rest = (np.array([2], np.int32), np.zeros((1, 2), np.int32), np.array([1], np.int64),
            np.array([2], np.int32), np.array([0.1]))
    with pytest.raises(ValueError, match="branches"):
        hypothesis_drafts(table, np.array([0], np.int32), ctx, *rest, 0, 6)
    with pytest.raises(ValueError, match="names no tree"):
        hypothesis_drafts(table, np.array([3], np.int32), ctx, *rest, 2, 6)
    with pytest.raises(ValueError, match="hypotheses per row"):
        hypothesis_drafts(table, np.array([0], np.int32), ctx, *rest, 2, 0)
    with pytest.raises(ValueError, match="sound"):
        hypothesis_drafts(table, np.array([0], np.int32), ctx, *rest[:2],
                        np.array([3], np.int64), *rest[3:], 2, 6)
    with pytest.raises(TypeError):
        hypothesis_drafts(table, np.array([0], np.int64), ctx, *rest, 2, 6)


def _reference_hypotheses(tree, context, d, k, b, min_prob, branches, alphabet, H):
    """By definition (the module docstring): the outcomes (a, x) for a in 0 … k and x
    each of the ``branches`` most frequent tokens after the context and d[:a] other than
    d[a], each with its chance (a's by :func:`_path_probs`, times x's share); the H
    most likely (the more likely first, among equals the smaller a, then the more
    frequent x) are hypotheses 0, 1, …, assuming d[:a] then x, with x's draft after it;
    slot u of the row is verified while the chance that it is accepted, summed over the
    hypotheses (the outcome's chance times the draft's probability of reaching u), is >=
    ``min_prob``, and every draft is cut to those L slots.  Returns lengths, tokens,
    drafts (``len(d)`` wide), L and each hypothesis's draft as cut."""
    lengths, drafts = [0] * H, [[0] * len(d) for _ in range(H)]
    tokens = [[-2] + [-1] * len(d) for _ in range(H)]
    own = [[] for _ in range(H)]
    slot = [0.0] * len(d)
    q = _path_probs(tree, context, d[:k])
    outcomes, reach = [], 1.0
    for a in range(k + 1):
        chance = reach * (1.0 - q[a]) if a < k else reach
        if a < k:
            reach *= q[a]
        if not context and not a:
            continue
        exclude = d[a] if a < k else -1
        got = _reference(tree, (context + d[:a])[-tree.max_depth:], exclude,
                         min(branches, H), b, min_prob, alphabet)
        outcomes += [(chance * share, a, x, draft, probs) for x, draft, probs, share in got]
    outcomes.sort(key=lambda o: -o[0])          # stable: the order found among equals
    for h, (chance, a, x, draft, probs) in enumerate(outcomes[:H]):
        lengths[h] = a + 1
        tokens[h] = d[:a] + [x] + [-1] * (len(d) - a)
        own[h] = draft[:len(d)]
        for u, pr in enumerate(probs[:len(d)]):
            slot[u] += chance * pr
    L = 0
    while L < len(d) and slot[L] > 0.0 and slot[L] >= min_prob:
        L += 1
    for h in range(H):
        own[h] = own[h][:L]
        drafts[h][:len(own[h])] = own[h]
    return lengths, tokens, drafts, L, own


def _path_probs(tree, context, d):
    """Each draft token's probability after the context and the drafts before it: along
    the context's longest stored suffix of at most D - k tokens, count over its
    context's count plus λ; 0 from the first one not stored (and all with no suffix)."""
    k, D = len(d), tree.max_depth
    q = [0.0] * k
    cap = max(D - k, 1)
    m = next((m for m in range(min(len(context), cap), 0, -1)
              if tree.count(context[-m:])), 0)
    if not m:
        return q
    s = context[-m:]
    for j in range(k):
        if m + j >= D or not tree.count(s + [d[j]]):
            break
        q[j] = tree.count(s + [d[j]]) / (tree.count(s) + tree.prior)
        s = s + [d[j]]
    return q


@pytest.mark.parametrize("most", [1, 3, 64])
def test_hypotheses_equal_the_reference(most):
    """Every row's hypotheses, their layout, longest draft and fallback against the
    definition, on random trees, keeping one, three or every outcome a row; rows that
    draft nothing or have no tree get none."""
    rng = random.Random(11 + most)
    for trial in range(60):
        trees = [SuffixTree(max_depth=rng.choice([8, 16, 32]),
                            prior=rng.choice([0.0, 0.5, 1.0, 3.0])) for _ in range(2)]
        alphabet = rng.randint(2, 5)
        for t in trees:
            for s in range(rng.randint(1, 5)):
                t.insert(s, [rng.randrange(alphabet) for _ in range(rng.randint(5, 50))])
        n, K = rng.randint(1, 6), rng.randint(1, 5)
        contexts = [[rng.randrange(alphabet) for _ in range(rng.randint(0, 20))]
                    for _ in range(n)]
        d = [[rng.randrange(alphabet) for _ in range(K)] for _ in range(n)]
        k = [rng.randint(0, K) for _ in range(n)]
        b = [rng.choice([0, 1, K]) for _ in range(n)]
        idx = [rng.choice([-1, 0, 1, 1]) for _ in range(n)]
        p, branches = rng.choice([0.0, 0.2]), rng.randint(1, 3)
        lengths, tokens, drafts, blen, draft_len, fallback, _ = _call(
            trees, idx, contexts, d, k, b, p, branches, most)
        H = lengths.shape[1]
        assert H == hypotheses.per_row(np.array(k)[np.array(b) > 0], branches, most)
        for i in range(n):
            if b[i] <= 0 or idx[i] < 0:
                assert not lengths[i].any() and not drafts[i].any(), (trial, i)
                assert draft_len[i] == 0 and fallback[i] == 0
                assert (tokens[i, :, 0] == -2).all() and (tokens[i, :, 1:] == -1).all()
                continue
            want = _reference_hypotheses(trees[idx[i]], contexts[i], d[i], k[i], b[i], p,
                                         branches, alphabet, H)
            assert lengths[i].tolist() == want[0], (trial, i)
            assert tokens[i].tolist() == want[1], (trial, i)
            assert drafts[i].tolist() == want[2], (trial, i)
            assert draft_len[i] == want[3], (trial, i)
            assert blen[i].tolist() == [1 + len(x) if L else 0
                                        for x, L in zip(want[4], want[0])], (trial, i)
            score = [L * H - h if L else -1 for h, L in enumerate(want[0])]
            assert fallback[i] == int(np.argmax(score)), (trial, i)


@pytest.mark.parametrize("most", [2, 8])
def test_hypotheses_equal_the_reference_on_the_trees_own_drafts(most):
    """As above, each row verifying the tree's own draft of its context (what the drafter
    gave it, so every count's suffix is one step from the count's below it until the
    depth's cap), on longer rollouts and drafts: the counts taken by their chance and
    the stop once ``most`` outcomes outrank the next count give the definition's
    hypotheses."""
    rng = random.Random(5 + most)
    for trial in range(40):
        tree = SuffixTree(max_depth=rng.choice([6, 12, 32]), prior=rng.choice([0.0, 0.5, 3.0]))
        alphabet = rng.randint(3, 8)
        text = [rng.randrange(alphabet) for _ in range(80)]
        for s in range(rng.randint(2, 6)):
            tree.insert(s, [t if rng.random() > 0.15 else rng.randrange(alphabet)
                            for t in text])
        n, K = rng.randint(1, 6), rng.randint(1, 8)
        contexts, d = [], []
        for _ in range(n):
            cut = rng.randint(1, 70)
            contexts.append(text[max(0, cut - rng.randint(1, 30)):cut])
            own = tree.draft(contexts[-1], K, 0.0, True)
            d.append((own + [rng.randrange(alphabet) for _ in range(K)])[:K])
        k = [rng.randint(0, K) for _ in range(n)]
        b = [rng.choice([1, K]) for _ in range(n)]
        p, branches = rng.choice([0.0, 0.2]), rng.randint(1, 4)
        lengths, tokens, drafts, _, draft_len, fallback, _ = _call(
            [tree], [0] * n, contexts, d, k, b, p, branches, most)
        H = lengths.shape[1]
        for i in range(n):
            want = _reference_hypotheses(tree, contexts[i], d[i], k[i], b[i], p, branches,
                                         alphabet, H)
            assert lengths[i].tolist() == want[0], (trial, i)
            assert tokens[i].tolist() == want[1], (trial, i)
            assert drafts[i].tolist() == want[2], (trial, i)
            assert draft_len[i] == want[3], (trial, i)


def test_hypotheses_by_hand():
    """A row verifying drafts (5, 6) in the step on the device has three outcomes to
    hypothesise: none, one or both accepted; the token after a rejected draft is not
    that draft; the more likely outcome comes first."""
    tree = SuffixTree(32)
    for s, x in enumerate([[1, 2, 5, 6, 7], [1, 2, 8, 9], [1, 2, 5, 3]]):
        tree.insert(s, x)
    lengths, tokens, drafts, _, draft_len, fallback, _ = _call(
        [tree], [0, 0], [[1, 2], [1, 2]], [[5, 6], [5, 6]], [2, 0], [2, 2], 0.0, 2)
    # row 0: none accepted -> 8 (not 5), then 9; one -> 3 (not 6); both -> 7, each a
    # chance of 1/3 (none by 1 - 2/3, a hair above the others in floating point)
    assert lengths.tolist() == [[1, 2, 3, 0, 0, 0], [1, 1, 0, 0, 0, 0]]
    assert tokens[0].tolist() == [[8, -1, -1], [5, 3, -1], [5, 6, 7], [-2, -1, -1],
                                  [-2, -1, -1], [-2, -1, -1]]
    assert drafts[0, 0].tolist() == [9, 0]
    # row 1 verifies nothing: its next token is 5 (then 3: a tie with 6, the smaller
    # token first) or 8 (then 9)
    assert tokens[1, :2, 0].tolist() == [5, 8]
    assert drafts[1, :2].tolist() == [[3, 0], [9, 0]]
    assert draft_len.tolist() == [1, 1] and fallback.tolist() == [2, 0]
    hyp = hypotheses.Hypotheses(lengths, tokens, drafts, draft_len, fallback)
    # the host's rule: the first hypothesis the sampled tokens equal (-1 padded)
    sampled = np.array([[5, 3, -1], [8, -1, -1]])
    assert hypotheses.match(sampled, hyp).tolist() == [1, 1]
    assert hypotheses.match(np.array([[5, 6, 9], [3, -1, -1]]), hyp).tolist() == [-1, -1]
    # the same tokens and more: not this hypothesis (the -1 padding is compared)
    assert hypotheses.match(np.array([[8, 9, -1], [5, 6, -1]]), hyp).tolist() == [-1, -1]
    # keeping the two most likely outcomes drops both accepted
    lengths2, tokens2, *_ = _call([tree], [0], [[1, 2]], [[5, 6]], [2], [2], 0.0, 2, most=2)
    assert lengths2.tolist() == [[1, 2]] and tokens2[0, 1].tolist() == [5, 3, -1]
    # how they came out: row 0 took 5 then 3 (one accepted, its token hypothesised),
    # row 1 (no sound draft: its next token only) took 8; then row 0 took 5 6 9 (both
    # accepted, 9 not the token hypothesised after them) and row 1 took 3 (not among its
    # two); then row 0 took 6 (none accepted, 6 not hypothesised after none) and row 1
    # 5 3 (an unsound draft accepted: a count not hypothesised)
    totals = dict.fromkeys(hypotheses.TALLY, 0)
    for got in (sampled, np.array([[5, 6, 9], [3, -1, -1]]),
                np.array([[6, -1, -1], [5, 3, -1]])):
        hypotheses.tally(got, hyp, hypotheses.match(got, hyp), totals)
    assert totals == {"rows": 6, "matched": 2, "count_missed": 1, "token_missed": 3,
                      "next_token_rows": 3, "next_token_matched": 1}
    hyp.without(np.array([False, True]))
    assert hypotheses.match(sampled, hyp).tolist() == [1, -1]


def test_device_selection_equals_the_host_rule():
    """The drafts the device takes are those of the hypothesis the host finds, or the
    fallback's, in NumPy (the CPU platform) and in torch ops (an accelerator); a
    discarded row (a prefill chunk) matches none."""
    import torch

    rng = np.random.default_rng(0)
    for _ in range(50):
        n, H, k = rng.integers(1, 9), rng.integers(1, 7), rng.integers(1, 5)
        width = int(rng.integers(1, k + 2))
        lengths = rng.integers(0, width + 1, size=(n, H)).astype(np.int32)
        tokens = np.where(np.arange(k + 1) < lengths[:, :, None],
                          rng.integers(0, 3, size=(n, H, k + 1)), -1).astype(np.int32)
        tokens[:, :, 0] = np.where(lengths > 0, tokens[:, :, 0], -2)
        hyp = hypotheses.Hypotheses(
            lengths=lengths, tokens=tokens,
            drafts=rng.integers(0, 50, size=(n, H, k)).astype(np.int32),
            draft_len=np.zeros(n, np.int32), fallback=rng.integers(0, H, size=n))
        counts = rng.integers(1, width + 1, size=n)
        sampled = np.where(np.arange(width) < counts[:, None],
                           rng.integers(0, 3, size=(n, width)), -1)
        discard = rng.random(n) < 0.2
        hyp.without(discard)
        host = hypotheses.match(sampled, hyp)
        # by definition: the first hypothesis whose tokens are the row's sampled ones
        for i in range(n):
            want = [h for h in range(H) if hyp.lengths[i, h] == counts[i] and
                    hyp.tokens[i, h, :counts[i]].tolist() == sampled[i, :counts[i]].tolist()]
            assert host[i] == (want[0] if want else -1)
        on_device = tuple(torch.from_numpy(x) for x in (hyp.tokens, hyp.drafts, hyp.fallback))
        want = hyp.drafts[np.arange(n), np.where(host >= 0, host, hyp.fallback)]
        # the CPU platform's path (NumPy) and an accelerator's (torch ops), here on the CPU
        dev = hypotheses.select_on_device(torch.from_numpy(sampled), on_device)
        assert np.array_equal(dev.numpy(), want)
        dev = hypotheses._select_torch(torch.from_numpy(sampled), *on_device)
        assert np.array_equal(dev.numpy(), want)
        assert not (host[discard] >= 0).any()


def test_a_step_shares_its_hypotheses_among_its_rows():
    """``most_likely``: the step's budget split among its drafting rows, at least the
    floor, at most ``MOST_PER_ROW``; H is that or all of a row's outcomes (k + 1 counts ×
    branches) where fewer; the config rejects floors outside [1, 64]."""
    from vllm_rl.das.config import DASConfig

    got = [hypotheses.most_likely(r, 4, 4096) for r in (0, 1, 64, 128, 256, 512, 1024, 4096)]
    assert got == [64, 64, 64, 32, 16, 8, 4, 4]
    assert hypotheses.most_likely(1024, 8, 0) == 8
    assert hypotheses.per_row(np.array([2, 0]), 4, 64) == 12
    assert hypotheses.per_row(np.array([8]), 4, 8) == 8
    assert hypotheses.per_row(np.array([], dtype=np.int64), 4, 8) == 4
    for bad in ({"hypotheses": 0}, {"hypotheses": 65}, {"step_hypotheses": -1}):
        with pytest.raises(ValueError, match="hypotheses"):
            DASConfig(**bad)


@pytest.mark.parametrize("threads", [2, 3, 8])
def test_hypotheses_on_threads_equal_one_thread(threads):
    """The rows shared among threads (at least 64 drafting rows a thread, chunks taken
    in turn): the same output, cell for cell, as one thread, over several trees (each
    thread holds one tree's lock at a time) and rows that draft nothing between them."""
    rng = random.Random(11 + threads)
    trees = [SuffixTree(max_depth=16, prior=0.5) for _ in range(5)]
    texts = []
    for j, tree in enumerate(trees):
        text = [rng.randrange(6) for _ in range(120)]
        texts.append(text)
        for s in range(4):
            tree.insert(s, [t if rng.random() > 0.1 else rng.randrange(6) for t in text])
    n, K = 700, 8
    tree_idx, contexts, d, k, b = [], [], [], [], []
    for _ in range(n):
        j = rng.randrange(len(trees))
        cut = rng.randint(1, 110)
        tree_idx.append(j if rng.random() > 0.05 else -1)
        contexts.append(texts[j][max(0, cut - rng.randint(1, 20)):cut])
        own = trees[j].draft(contexts[-1], K, 0.0, True)
        d.append((own + [rng.randrange(6) for _ in range(K)])[:K])
        k.append(rng.randint(0, K))
        b.append(rng.choice([0, 2, K]))
    one = _call(trees, tree_idx, contexts, d, k, b, 0.1, 4, 8)
    many = _call(trees, tree_idx, contexts, d, k, b, 0.1, 4, 8, threads)
    for x, y in zip(one[:-1], many[:-1]):      # all but the CPU time
        np.testing.assert_array_equal(x, y)
    assert (one[4] > 0).sum() > 100           # the rows draft
