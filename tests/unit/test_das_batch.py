"""The batched drafter step (``vllm_rl.das.tree.feed_and_draft``, DAS Sec. 4.1.2): one C++
call that extends every row's rollout and then drafts for every row must equal the
per-row calls (``extend`` for all rows, then ``draft``), with a budget and a ``min_prob``
per row, release the GIL, and reject bad arrays before touching a tree."""
from __future__ import annotations

import random

import numpy as np
import pytest

from vllm_rl.das.budget_model import AcceptanceEstimate, estimate_k, estimate_k_many
from vllm_rl.das.store import ProblemTrees
from vllm_rl.das.tree import SuffixTree, TreeTable, draft_lists, feed_and_draft

from test_suffix_tree import assert_releases_gil


def _rows(rng: random.Random, n: int, alphabet: int, max_new: int = 4):
    """Per row: new tokens (0..max_new of them), a budget and a min_prob."""
    new = [[rng.randrange(alphabet) for _ in range(rng.randint(0, max_new))] for _ in range(n)]
    budgets = [rng.choice([0, 1, 3, 8]) for _ in range(n)]
    probs = [rng.choice([0.0, 0.1, 0.3, 0.9]) for _ in range(n)]
    return new, budgets, probs


def _arrays(new, n_cols, histories):
    lens = np.array([len(x) for x in new], dtype=np.int64)
    offsets = np.zeros(len(new) + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    tokens = np.array([t for x in new for t in x], dtype=np.int32)
    ctx = np.zeros((len(new), n_cols), dtype=np.int32)
    ctx_len = np.zeros(len(new), dtype=np.int32)
    for i, h in enumerate(histories):
        ctx[i, :len(h)] = h
        ctx_len[i] = len(h)
    return tokens, offsets, ctx, ctx_len


@pytest.mark.parametrize("seed", range(6))
def test_batch_equals_per_row_calls(seed):
    rng = random.Random(seed)
    alphabet, depth, n_trees, n_rows = rng.choice([3, 5, 20]), rng.choice([8, 16, 32]), 3, 12
    pairs = [(SuffixTree(depth), SuffixTree(depth)) for _ in range(n_trees)]
    table = TreeTable()
    idx = [table.add(a) for a, _ in pairs]
    for a, b in pairs:                              # finished rollouts in the window
        for s in range(rng.randint(1, 4)):
            seq = [rng.randrange(alphabet) for _ in range(rng.randint(5, 80))]
            a.insert(s, seq)
            b.insert(s, seq)
    row_tree = [rng.randrange(n_trees) for _ in range(n_rows)]
    histories = [[] for _ in range(n_rows)]
    for step in range(8):
        new, budgets, probs = _rows(rng, n_rows, alphabet)
        skip = [rng.random() < 0.1 for _ in range(n_rows)]      # rows without a tree
        feed = [0 if s else rng.randint(0, len(x)) for x, s in zip(new, skip)]
        # reference: every row's feed, then every row's draft
        for i in range(n_rows):
            if not skip[i] and feed[i]:
                pairs[row_tree[i]][1].extend(100 + i, new[i][:feed[i]])
                histories[i] += new[i][:feed[i]]
        want = [[] if skip[i] or not budgets[i] or not histories[i] else
                pairs[row_tree[i]][1].draft(histories[i], budgets[i], probs[i], backoff=True)
                for i in range(n_rows)]
        tokens, offsets, ctx, ctx_len = _arrays(new, 200, histories)
        res = feed_and_draft(
            table, np.array([-1 if s else idx[t] for s, t in zip(skip, row_tree)], np.int32),
            np.arange(100, 100 + n_rows, dtype=np.int64), tokens, offsets,
            np.array(feed, np.int32), ctx, ctx_len, np.array(budgets, np.int32),
            np.array(probs, np.float64))
        assert res.lists() == want, (seed, step)
        assert [list(res.drafts[i, :res.lengths[i]]) for i in range(n_rows)] == want
        for a, b in pairs:
            assert a.sequences() == b.sequences()
            assert [a.sequence(s) for s in a.sequences()] == [b.sequence(s) for s in b.sequences()]
            assert (a.num_nodes(), a.memory_bytes()) == (b.num_nodes(), b.memory_bytes())
            assert a.check_invariants() == ""


def test_per_row_min_prob_and_budget():
    tree = SuffixTree(16)
    tree.insert(0, [1, 2, 3, 4])
    tree.insert(1, [1, 2, 5, 6])
    tree.insert(2, [1, 2, 5, 7])
    ctx = np.array([[1, 2], [1, 2], [1, 2], [1, 2]], np.int32)
    res = feed_and_draft([tree], np.zeros(4, np.int32), np.arange(10, 14, dtype=np.int64),
                         np.zeros(0, np.int32), np.zeros(5, np.int64), None, ctx,
                         np.full(4, 2, np.int32), np.array([4, 4, 1, 0], np.int32),
                         np.array([0.5, 0.7, 0.0, 0.0]))
    # after [1, 2]: 5 with 2/3, then 6 or 7 with 1/2 each (cumulative 1/3)
    assert res.lists() == [tree.draft([1, 2], 4, 0.5), tree.draft([1, 2], 4, 0.7), [5], []]
    assert res.lists()[:2] == [[5], []]


def _same_info(got, want):
    return (list(got.tokens), list(got.probs), got.match_len, got.match_count) == \
        (list(want.tokens), list(want.probs), want.match_len, want.match_count)


def _patterned(rng: random.Random, alphabet: int, n: int) -> list[int]:
    """Repeats of a few short motifs with some noise: long matches, ties, and suffixes
    whose only continuation is elsewhere in the rollout itself."""
    motifs = [[rng.randrange(alphabet) for _ in range(rng.randint(1, 6))] for _ in range(3)]
    out: list[int] = []
    while len(out) < n:
        out += rng.choice(motifs) if rng.random() < 0.85 else [rng.randrange(alphabet)]
    return out[:n]


@pytest.mark.parametrize("seed", range(10))
def test_rollout_rows_draft_from_the_append_state(seed):
    """The batched step drafts a row whose context ends like its growing rollout from
    that rollout's append state (``_draft_info_from_rollout``) instead of walking from
    the root.  Long rollouts past max_depth, repeated patterns, contexts longer than the
    stored rollout (the stored prompt tail is shorter than the prompt, or the rollout was
    removed and restarts), contexts that end differently, sealed and removed rollouts,
    budgets past max_depth: every row must equal ``draft(..., backoff=True)``, and the
    rollout path, where it decides, must equal ``draft_info`` in every field."""
    rng = random.Random(1000 + seed)
    alphabet = rng.choice([2, 3, 6, 40])
    depth = rng.choice([1, 2, 4, 8, 16, 32, 64])
    n_trees, n_rows = 2, 16
    pairs = [(SuffixTree(depth), SuffixTree(depth)) for _ in range(n_trees)]
    table = TreeTable()
    idx = [table.add(a) for a, _ in pairs]
    for a, b in pairs:
        for s in range(rng.randint(0, 3)):
            seq = _patterned(rng, alphabet, rng.randint(1, 120))
            a.insert(s, seq)
            b.insert(s, seq)
    row_tree = [rng.randrange(n_trees) for _ in range(n_rows)]
    seq_id = [100 + i for i in range(n_rows)]
    # The runner's context is prompt + output; the stored rollout is the last `tail`
    # prompt tokens + output (tail 0 .. longer than the prompt).
    contexts, stored = [], []
    for i in range(n_rows):
        prompt = _patterned(rng, alphabet, rng.randint(0, 40))
        tail = rng.choice([0, 1, 3, depth, 1000])
        contexts.append(list(prompt))
        stored.append(prompt[max(0, len(prompt) - tail):])
    sealed = [False] * n_rows
    decided = undecided = 0
    for step in range(14):
        new = [_patterned(rng, alphabet, rng.choice([0, 1, 1, 2, 5, 20])) for _ in range(n_rows)]
        budgets = [rng.choice([0, 1, 2, 3, 8, depth - 1, depth, depth + 5]) for _ in range(n_rows)]
        budgets = [max(0, x) for x in budgets]
        probs = [rng.choice([0.0, 0.0, 0.1, 0.3, 0.9]) for _ in range(n_rows)]
        skip = [rng.random() < 0.05 for _ in range(n_rows)]
        feed = [0 if skip[i] or sealed[i] else rng.randint(0, len(new[i])) for i in range(n_rows)]
        for i in range(n_rows):                      # the prompt's stored part, when new
            if step == 0 and stored[i] and not skip[i]:
                for t in pairs[row_tree[i]]:
                    t.extend(seq_id[i], stored[i])
        for i in range(n_rows):
            if feed[i]:
                pairs[row_tree[i]][1].extend(seq_id[i], new[i][:feed[i]])
                contexts[i] += new[i][:feed[i]]
        for i in range(n_rows):                      # now and then the context ends differently
            if contexts[i] and rng.random() < 0.05:
                contexts[i][-1] = (contexts[i][-1] + 1) % alphabet
        want = [[] if skip[i] or not budgets[i] or not contexts[i] else
                pairs[row_tree[i]][1].draft(contexts[i], budgets[i], probs[i], backoff=True)
                for i in range(n_rows)]
        for i in range(n_rows):
            ref = pairs[row_tree[i]][1]
            if skip[i] or not contexts[i]:
                continue
            got = ref._draft_info_from_rollout(seq_id[i], contexts[i], budgets[i], probs[i])
            if got is None:
                undecided += 1
            else:
                decided += 1
                assert _same_info(got, ref.draft_info(contexts[i], budgets[i], probs[i],
                                                      backoff=True)), (seed, step, i)
        tokens, offsets, ctx, ctx_len = _arrays(new, max(map(len, contexts)) + 1, contexts)
        res = feed_and_draft(
            table, np.array([-1 if s else idx[t] for s, t in zip(skip, row_tree)], np.int32),
            np.array(seq_id, np.int64), tokens, offsets, np.array(feed, np.int32), ctx, ctx_len,
            np.array(budgets, np.int32), np.array(probs, np.float64))
        assert res.lists() == want, (seed, step)
        for a, b in pairs:
            assert [a.sequence(s) for s in a.sequences()] == [b.sequence(s) for s in b.sequences()]
            assert a.check_invariants() == ""
        # between steps: seal some rollouts, remove others (they restart from scratch
        # under a new id with a context much longer than what is stored), or remove a
        # finished one
        for i in range(n_rows):
            r = rng.random()
            if r < 0.04 and not sealed[i] and seq_id[i] in pairs[row_tree[i]][0]:
                for t in pairs[row_tree[i]]:
                    t.finish(seq_id[i])
                sealed[i] = True
            elif r < 0.08 and seq_id[i] in pairs[row_tree[i]][0]:
                for t in pairs[row_tree[i]]:
                    t.remove(seq_id[i])
                seq_id[i] += 1000
                sealed[i] = False
        for a, b in pairs:
            if rng.random() < 0.2 and 0 in a:
                a.remove(0)
                b.remove(0)
    if depth > 1:
        assert 3 * decided > decided + undecided, (decided, undecided)


def test_rollout_path_on_a_long_periodic_rollout():
    """One rollout far past max_depth repeating a motif: every suffix shorter than the
    cap occurs earlier in the rollout, so the rollout path decides from the append state
    at every step, with backoff at the boundary where only the rollout itself holds it."""
    for depth in (3, 8, 64):
        tree, ref = SuffixTree(depth), SuffixTree(depth)
        motif = [5, 1, 5, 2, 7, 5, 1, 5]
        ctx: list[int] = [9, 9]                      # a prompt that is not stored
        decided = 0
        for step in range(200):
            t = motif[step % len(motif)] if step % 37 else 3
            ctx.append(t)
            ref.extend(1, [t])
            for b, p in ((1, 0.0), (4, 0.1), (8, 0.6), (depth, 0.0)):
                want = ref.draft_info(ctx, b, p, backoff=True)
                got = ref._draft_info_from_rollout(1, ctx, b, p)
                if got is not None:
                    decided += 1
                    assert _same_info(got, want), (depth, step, b)
            res = feed_and_draft([tree], np.zeros(1, np.int32), np.ones(1, np.int64),
                                 np.array([t], np.int32), np.array([0, 1], np.int64), None,
                                 np.array([ctx], np.int32), np.array([len(ctx)], np.int32),
                                 np.array([4], np.int32), np.array([0.1]))
            assert res.lists() == [ref.draft(ctx, 4, 0.1, backoff=True)], (depth, step)
        assert decided > 700, (depth, decided)
    assert tree.check_invariants() == ""


def test_store_batch_accounts_tokens_and_skips_rollouts_that_stopped_growing():
    store = ProblemTrees(window=4)
    a = store.start("A", [1, 2])
    b = store.start("B", [3])
    done = store.start("A", [])
    store.extend("A", done, [9])
    store.finish("A", done, 1)
    seqs = np.array([a, -1, b, done], np.int64)
    new = [[4, 5], [6], [7], [8]]
    tokens, offsets, ctx, ctx_len = _arrays(new, 8, [[1, 2, 4, 5], [], [3, 7], [9, 8]])
    store.feed_and_draft(seqs, tokens, offsets, np.array([2, 1, 1, 1], np.int32), ctx,
                         ctx_len, np.zeros(4, np.int32), np.full(4, 0.1))
    assert list(store.sequences("A")) == [[1, 2, 4, 5], [9]]      # the finished one unchanged
    assert list(store.sequences("B")) == [[3, 7]]
    assert store.stored_tokens == 4 + 1 + 2
    store.finish("A", a, 2)
    store.clear("B")
    assert store.stored_tokens == 5                             # the batch-fed tokens too
    store.feed_and_draft(np.array([b], np.int64), np.array([1], np.int32),
                         np.array([0, 1], np.int64), np.ones(1, np.int32),
                         np.zeros((1, 1), np.int32), np.zeros(1, np.int32),
                         np.zeros(1, np.int32), np.zeros(1))   # cleared: fed nowhere
    assert store.stored_tokens == 5 and "B" not in store.problems


def test_batch_releases_the_gil():
    # As test_suffix_tree's check: node [0] has 20k children, so each draft scans them
    # all; another Python thread must run while the batch works.
    n, k = 20000, 5000
    tree = SuffixTree(4)
    tree.insert(0, [tok for t in range(1, n + 1) for tok in (0, t)])
    table = TreeTable()
    i = table.add(tree)
    ctx = np.zeros((k, 1), np.int32)

    def call():
        return feed_and_draft(table, np.full(k, i, np.int32), np.arange(1, k + 1, dtype=np.int64),
                              np.zeros(0, np.int32), np.zeros(k + 1, np.int64), None, ctx,
                              np.ones(k, np.int32), np.ones(k, np.int32), np.zeros(k)).lists()

    assert_releases_gil(call, [[1]] * k, "the batch")


def _good():
    tree = SuffixTree(8)
    return dict(trees=[tree], tree_idx=np.zeros(2, np.int32), seq_ids=np.arange(2, dtype=np.int64),
                tokens=np.array([1, 2, 3], np.int32), offsets=np.array([0, 1, 3], np.int64),
                feed=None, contexts=np.zeros((2, 4), np.int32),
                context_len=np.zeros(2, np.int32), max_tokens=np.ones(2, np.int32),
                min_prob=np.full(2, 0.1)), tree


@pytest.mark.parametrize("change, error, match", [
    ({"tree_idx": np.zeros(2, np.int64)}, TypeError, "tree_idx must have dtype int32"),
    ({"tokens": [1, 2, 3]}, TypeError, "tokens must be a numpy array"),
    ({"seq_ids": np.arange(3, dtype=np.int64)}, ValueError, "seq_ids must have 2 entries"),
    ({"offsets": np.array([0, 1, 4], np.int64)}, ValueError, "offsets run past"),
    ({"offsets": np.array([0, 2, 1], np.int64)}, ValueError, "row 1: offsets must not decrease"),
    ({"tree_idx": np.array([0, 3], np.int32)}, ValueError, "row 1: tree index 3 names no tree"),
    ({"feed": np.array([2, 0], np.int32)}, ValueError, "row 0: feed must be in"),
    ({"context_len": np.array([0, 5], np.int32)}, ValueError, "row 1: context length"),
    ({"max_tokens": np.array([-1, 0], np.int32)}, ValueError, "row 0: max_tokens must be >= 0"),
    ({"min_prob": np.array([0.1, 1.5])}, ValueError, "row 1: min_prob must be in"),
    ({"min_prob": np.array([0.1, np.nan])}, ValueError, "row 1: min_prob must be in"),
    ({"contexts": np.zeros(2, np.int32)}, ValueError, "contexts must have 2 dimension"),
    ({"contexts": np.zeros((1, 4), np.int32)}, ValueError, "contexts has 1 rows, needs 2"),
    ({"contexts": np.zeros((2, 8), np.int32)[:, ::2]}, ValueError, "contiguous"),
])
def test_bad_arrays_raise_before_any_tree_changes(change, error, match):
    args, tree = _good()
    args.update(change)
    with pytest.raises(error, match=match):
        feed_and_draft(**args)
    assert tree.num_sequences() == 0


def test_a_finished_sequence_is_named():
    args, tree = _good()
    tree.insert(1, [5])
    with pytest.raises(ValueError, match="row 1: sequence 1 is finished"):
        feed_and_draft(**args)


def test_table_indexes_are_reused_and_checked():
    table = TreeTable()
    a, b = SuffixTree(4), SuffixTree(4)
    ia, ib = table.add(a), table.add(b)
    assert (ia, ib, len(table)) == (0, 1, 2) and table[ia] is a
    table.remove(ia)
    with pytest.raises(IndexError):
        table.remove(ia)
    assert table.add(SuffixTree(4)) == ia and len(table) == 2


def test_draft_lists_checks_lengths():
    drafts = np.arange(6, dtype=np.int32).reshape(2, 3)
    assert draft_lists(drafts, np.array([2, 0], np.int32)) == [[0, 1], []]
    with pytest.raises(ValueError, match=r"lengths\[0\]"):
        draft_lists(drafts, np.array([4, 0], np.int32))


def test_estimate_k_many_equals_the_scalar_estimate():
    rng = random.Random(3)
    rows = []
    for _ in range(2000):
        p = rng.randrange(0, 200)
        a = rng.randrange(0, p + 1) if p else 0
        rows.append((p, a, a + rng.randrange(0, 100), rng.random()))
    P, A, G, prior = (np.array(c) for c in zip(*rows))
    got = estimate_k_many(P, A, G, prior)
    want = [estimate_k(AcceptanceEstimate(p, a, g), q) for p, a, g, q in rows]
    assert np.allclose(got, want, rtol=0, atol=1e-12)
