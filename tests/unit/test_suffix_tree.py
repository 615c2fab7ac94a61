"""The DAS suffix tree (``vllm_rl._C.SuffixTree``, DAS Sec. 4.1.2) against a brute-force model.

The reference keeps the raw sequences and counts substrings directly.  Random operation
sequences (extend in pieces, insert, finish, remove) over small alphabets (so substrings
repeat a lot, down to one-letter runs) are replayed on both, and after each step the
tree's own invariant check runs and its counts, node set size, matches and drafts must
equal the reference's.  Memory must return exactly to its earlier value when sequences go.
"""
from __future__ import annotations

import random
import sys
import threading
from collections import Counter, defaultdict

import pytest

from vllm_rl.das import SuffixTree, UnknownSequenceError, draft_many


class Reference:
    """Brute force: the stored sequences, and every substring of length <= D counted."""

    def __init__(self, max_depth: int, prior: float = 0.0):
        self.D = max_depth
        self.prior = prior
        self.seqs: dict[int, list[int]] = {}
        self.growing: set[int] = set()

    def extend(self, sid, tokens):
        self.seqs.setdefault(sid, []).extend(tokens)
        self.growing.add(sid)

    def insert(self, sid, tokens):
        self.seqs[sid] = list(tokens)

    def finish(self, sid):
        self.growing.discard(sid)

    def remove(self, sid):
        del self.seqs[sid]
        self.growing.discard(sid)

    def index(self):
        """(occurrence counts, strings ending per path, children per path)."""
        cnt, ends, kids = Counter(), Counter(), defaultdict(set)
        for x in self.seqs.values():
            n = len(x)
            for i in range(n):
                top = min(n, i + self.D)
                for j in range(i + 1, top + 1):
                    cnt[tuple(x[i:j])] += 1
                ends[tuple(x[i:top])] += 1
        for w in cnt:
            kids[w[:-1]].add(w[-1])
        return cnt, ends, kids

    def num_tokens(self):
        return sum(len(x) for x in self.seqs.values())

    def num_nodes(self, idx):
        cnt, ends, kids = idx
        return 1 + sum(1 for w in cnt if ends[w] > 0 or len(kids[w]) >= 2)

    def longest(self, idx, context, cap):
        cnt = idx[0]
        for k in range(min(len(context), cap), 0, -1):
            if tuple(context[len(context) - k:]) in cnt:
                return k
        return 0

    def match(self, idx, context):
        m = self.longest(idx, context, self.D)
        return m, (idx[0][tuple(context[len(context) - m:])] if m else self.num_tokens())

    def draft(self, idx, context, max_tokens, min_prob):
        """Greedy most-frequent continuation; the cutoff is on the cumulative probability,
        each token's count over its context's plus the prior λ."""
        cnt, _, kids = idx
        b = min(max_tokens, self.D)
        if b <= 0:
            return [], []
        m = self.longest(idx, context, max(self.D - b, 1))
        if m == 0:
            return [], []
        s = tuple(context[len(context) - m:])
        tokens, probs, prob = [], [], 1.0
        while len(tokens) < min(b, self.D - m) and kids.get(s):
            t = min(kids[s], key=lambda t: (-cnt[s + (t,)], t))
            p = prob * (cnt[s + (t,)] / (cnt[s] + self.prior))
            if p < min_prob:
                break
            prob = p
            tokens.append(t)
            probs.append(prob)
            s = s + (t,)
        return tokens, probs


def assert_same(tree: SuffixTree, ref: Reference, rng: random.Random, contexts: int = 20):
    assert tree.check_invariants() == ""
    idx = ref.index()
    cnt = idx[0]
    assert tree.num_tokens() == ref.num_tokens()
    assert tree.num_nodes() == ref.num_nodes(idx)
    assert tree.sequences() == sorted(ref.seqs)
    for sid, x in ref.seqs.items():
        assert tree.sequence(sid) == x
        assert tree.is_growing(sid) == (sid in ref.growing)
    for w, c in cnt.items():
        assert tree.count(list(w)) == c, w
    alphabet = sorted({t for x in ref.seqs.values() for t in x}) or [0]
    for _ in range(10):  # absent patterns
        w = [rng.choice(alphabet + [99]) for _ in range(rng.randint(1, ref.D))]
        assert tree.count(w) == cnt.get(tuple(w), 0)
    for _ in range(contexts):
        context = random_context(rng, ref, alphabet)
        assert tree.match(context) == ref.match(idx, context)
        b = rng.randint(0, ref.D + 2)
        p = rng.choice([0.0, 0.0, 0.2, 0.34, 0.5, 0.75, 1.0])
        tokens, probs = ref.draft(idx, context, b, p)
        info = tree.draft_info(context, b, p)
        assert (info.tokens, info.probs) == (tokens, probs), (context, b, p)
        assert tree.draft(context, b, p) == tokens


def random_context(rng, ref, alphabet):
    """Mostly a stored substring with a random prefix, sometimes noise."""
    pieces = [rng.choice(alphabet + [99]) for _ in range(rng.randint(0, 3))]
    seqs = [x for x in ref.seqs.values() if x]
    if seqs and rng.random() < 0.85:
        x = rng.choice(seqs)
        i = rng.randrange(len(x))
        pieces += x[i:rng.randint(i + 1, len(x))]
    if rng.random() < 0.15:
        pieces.append(rng.choice(alphabet + [99]))
    return pieces


def random_ops(seed: int, steps: int, check_every: int):
    rng = random.Random(seed)
    D = rng.choice([1, 2, 3, 4, 6, 8])
    alphabet = rng.choice([[0], [0, 1], [0, 1, 2], list(range(5)), list(range(20)),
                           list(range(60)), [-2**31, -1, 0, 2**31 - 1]])
    prior = rng.choice([0.0, 0.0, 0.5, 1.0])
    tree, ref = SuffixTree(D, prior), Reference(D, prior)
    next_id = rng.randint(-5, 5)
    for step in range(steps):
        op = rng.random()
        word = lambda k: [rng.choice(alphabet) for _ in range(rng.randint(0, k))]  # noqa: E731
        if op < 0.35:
            growing = sorted(ref.growing)
            sid = rng.choice(growing) if growing and rng.random() < 0.7 else next_id
            next_id += 1 if sid == next_id else 0
            tokens = word(10)
            tree.extend(sid, tokens)
            ref.extend(sid, tokens)
        elif op < 0.6:
            tokens = word(25)
            tree.insert(next_id, tokens)
            ref.insert(next_id, tokens)
            next_id += 1
        elif op < 0.72 and ref.growing:
            sid = rng.choice(sorted(ref.growing))
            tree.finish(sid)
            ref.finish(sid)
        elif ref.seqs:
            sid = rng.choice(sorted(ref.seqs))
            tree.remove(sid)
            ref.remove(sid)
        if step % check_every == 0 or step == steps - 1:
            assert_same(tree, ref, rng)
        else:
            assert tree.check_invariants() == ""
    return tree, ref


@pytest.mark.parametrize("block", range(8))
def test_random_operations_match_brute_force(block):
    for seed in range(block * 40, block * 40 + 40):
        random_ops(seed, steps=30, check_every=3)


def test_hand_example_draft_and_cutoff():
    a, b, c, d = 1, 2, 3, 4
    tree = SuffixTree(8)
    for i in range(3):
        tree.insert(i, [a, b, c])
    tree.insert(3, [a, b, d])
    assert tree.count([a, b]) == 4 and tree.count([b, c]) == 3 and tree.count([c]) == 3
    assert tree.match([9, a, b]) == (2, 4)
    assert tree.match([9]) == (0, tree.num_tokens())
    info = tree.draft_info([a], 4, 0.5)
    assert info.tokens == [b, c] and info.probs == [1.0, 0.75] and info.match_len == 1
    assert tree.draft([a], 4, 0.8) == [b]           # 3/4 < 0.8 stops before c
    assert tree.draft([a], 4, 0.0) == [b, c]        # nothing follows c
    assert tree.draft([9], 4, 0.0) == []            # no context suffix matches
    assert tree.draft([a], 0, 0.0) == []


def test_prior_shrinks_each_tokens_probability():
    """λ = 1 (PPM's method A): every token, the one continuation inside an edge too, has
    count / (count of its context + 1); λ = 0 keeps the raw ratio."""
    a, b, c, d = 1, 2, 3, 4
    raw, shrunk = SuffixTree(8), SuffixTree(8, prior=1.0)
    for tree in (raw, shrunk):
        for i in range(3):
            tree.insert(i, [a, b, c])
        tree.insert(3, [a, b, d])
    assert raw.prior == 0.0 and shrunk.prior == 1.0
    assert raw.draft_info([a], 4, 0.0).probs == [1.0, 0.75]
    assert shrunk.draft_info([a], 4, 0.0).probs == pytest.approx([4 / 5, 4 / 5 * 3 / 5])
    assert shrunk.draft([a], 4, 0.5) == [b]           # 0.48 < 0.5 stops before c
    with pytest.raises(ValueError, match="prior"):
        SuffixTree(8, prior=-1.0)


def test_draft_context_is_capped_by_depth():
    # With max_depth 4 a 3-token draft can only continue a 1-token context suffix.
    tree = SuffixTree(4)
    tree.insert(0, [5, 6, 7, 8, 9, 1, 2])
    info = tree.draft_info([5, 6, 7], 3, 0.0)
    assert info.match_len == 1 and info.tokens == [8, 9, 1]
    assert tree.match([5, 6, 7]) == (3, 1)
    assert tree.draft_info([5, 6, 7], 1, 0.0).match_len == 3


def test_sliding_window_equals_fresh_tree():
    rng = random.Random(7)
    for D in (3, 8, 64):
        W, k = 6, 5
        rollouts = [[rng.randrange(6) for _ in range(rng.randint(0, 120))]
                    for _ in range(W + k)]
        tree = SuffixTree(D)
        for i, x in enumerate(rollouts):
            if i % 2:
                tree.insert(i, x)
            else:  # grown in pieces, then finished
                for j in range(0, len(x), 7):
                    tree.extend(i, x[j:j + 7])
                tree.extend(i, [])
                tree.finish(i)
        for i in range(k):
            tree.remove(i)
        fresh, ref = SuffixTree(D), Reference(D)
        for i in range(k, W + k):
            fresh.insert(i, rollouts[i])
            ref.insert(i, rollouts[i])
        assert tree.check_invariants() == ""
        assert tree.sequences() == fresh.sequences() == list(range(k, W + k))
        assert tree.num_nodes() == fresh.num_nodes()
        assert tree.num_tokens() == fresh.num_tokens()
        assert tree.memory_bytes() == fresh.memory_bytes()
        assert_same(tree, ref, rng, contexts=100)


def test_memory_returns_to_base():
    rng = random.Random(11)
    tree = SuffixTree(16)
    base_bytes, base_nodes = tree.memory_bytes(), tree.num_nodes()
    assert base_nodes == 1 and tree.num_tokens() == 0
    keep = {}
    for i in range(8):
        keep[i] = [rng.randrange(4) for _ in range(rng.randint(1, 200))]
        tree.insert(i, keep[i])
    tree.extend(100, [1, 2, 3])                     # a growing sequence stays throughout
    mid_bytes, mid_nodes = tree.memory_bytes(), tree.num_nodes()
    for rnd in range(5):
        extra = []
        for i in range(6):
            sid = 1000 * (rnd + 1) + i
            x = [rng.randrange(4) for _ in range(rng.randint(0, 300))]
            if i % 3 == 0:
                tree.insert(sid, x)
            else:
                for j in range(0, len(x), 13):
                    tree.extend(sid, x[j:j + 13])
                if i % 3 == 1:
                    tree.finish(sid)
            extra.append(sid)
        assert tree.memory_bytes() > mid_bytes
        rng.shuffle(extra)
        for sid in extra:
            tree.remove(sid)
        assert tree.check_invariants() == ""
        assert (tree.memory_bytes(), tree.num_nodes()) == (mid_bytes, mid_nodes)
    for sid in [100, *keep]:
        tree.remove(sid)
    assert tree.check_invariants() == ""
    assert (tree.memory_bytes(), tree.num_nodes(), tree.num_tokens()) == (base_bytes, 1, 0)
    assert tree.sequences() == []


def test_extend_in_pieces_equals_insert_at_once():
    rng = random.Random(3)
    for trial in range(30):
        D = rng.choice([2, 5, 64])
        seqs = [[rng.randrange(rng.choice([2, 7])) for _ in range(rng.randint(0, 150))]
                for _ in range(4)]
        whole, pieces = SuffixTree(D), SuffixTree(D)
        for i, x in enumerate(seqs):
            whole.insert(i, x)
        cursors = [0] * len(seqs)
        while any(c < len(x) for c, x in zip(cursors, seqs)):  # interleaved growth
            i = rng.randrange(len(seqs))
            step = rng.randint(0, 9)
            pieces.extend(i, seqs[i][cursors[i]:cursors[i] + step])
            cursors[i] += step
        for i in range(len(seqs)):
            pieces.extend(i, [])
            pieces.finish(i)
        assert pieces.check_invariants() == ""
        assert pieces.num_nodes() == whole.num_nodes()
        assert pieces.memory_bytes() == whole.memory_bytes()
        for _ in range(30):
            x = rng.choice(seqs)
            i = rng.randrange(len(x) + 1)
            w = x[i:i + rng.randint(1, D)]
            if w:
                assert pieces.count(w) == whole.count(w)
            ctx = x[:i]
            assert pieces.draft_info(ctx, 4, 0.1).probs == whole.draft_info(ctx, 4, 0.1).probs
            assert pieces.draft(ctx, 4, 0.1) == whole.draft(ctx, 4, 0.1)


def test_batch_equals_single_calls():
    rng = random.Random(5)
    trees = []
    for t in range(3):
        tree = SuffixTree(12)
        for i in range(10):
            tree.insert(i, [rng.randrange(5) for _ in range(rng.randint(20, 80))])
        trees.append(tree)
    contexts = [[rng.randrange(5) for _ in range(rng.randint(0, 20))] for _ in range(300)]
    budgets = [rng.randint(0, 14) for _ in contexts]
    for p in (0.0, 0.25, 0.6):
        tree = trees[0]
        assert tree.draft_batch(contexts, 6, p) == [tree.draft(c, 6, p) for c in contexts]
        assert tree.draft_batch(contexts, budgets, p) == [
            tree.draft(c, b, p) for c, b in zip(contexts, budgets)]
        owners = [trees[i % 3] for i in range(len(contexts))]
        assert draft_many(owners, contexts, budgets, p) == [
            t.draft(c, b, p) for t, c, b in zip(owners, contexts, budgets)]
        assert draft_many(owners, contexts, 5, p) == [
            t.draft(c, 5, p) for t, c in zip(owners, contexts)]
    assert trees[0].draft_batch([], 3) == []


def test_context_forms_and_long_contexts():
    import numpy as np

    rng = random.Random(9)
    tree = SuffixTree(16)
    for i in range(5):
        tree.insert(i, [rng.randrange(4) for _ in range(300)])
    noise = [rng.randrange(1000) for _ in range(100000)]
    for _ in range(50):
        ctx = [rng.randrange(4) for _ in range(rng.randint(0, 40))]
        want = tree.draft_info(ctx, 5, 0.2)
        long_ctx = noise + ctx[-16:]
        for form in (tuple(ctx), np.array(ctx, dtype=np.int64), np.array(ctx, dtype=np.int32)):
            assert tree.draft(form, 5, 0.2) == want.tokens
            assert tree.match(form) == tree.match(ctx)
        if len(ctx) >= 16:  # only the last max_depth tokens can matter
            assert tree.draft(long_ctx, 5, 0.2) == want.tokens
            assert tree.match(long_ctx) == tree.match(ctx)
    assert tree.draft_batch((np.array([1, 2]), (1, 2), [1, 2]), 4) == [tree.draft([1, 2], 4)] * 3
    with pytest.raises(TypeError):
        tree.draft(["a"], 3)
    with pytest.raises(TypeError):
        tree.draft([2**40], 3)
    with pytest.raises(TypeError):
        tree.draft_batch([[1], "ab"], 3)


def test_errors():
    with pytest.raises(ValueError):
        SuffixTree(0)
    tree = SuffixTree(4)
    tree.insert(1, [1, 2])
    with pytest.raises(ValueError):
        tree.insert(1, [3])
    with pytest.raises(ValueError):
        tree.extend(1, [3])                          # finished
    with pytest.raises(KeyError):
        tree.remove(2)
    with pytest.raises(UnknownSequenceError):
        tree.finish(2)
    with pytest.raises(ValueError):
        tree.count([1, 2, 3, 4, 5])                  # longer than max_depth
    with pytest.raises(ValueError):
        tree.draft([1], 2, 1.5)
    with pytest.raises(ValueError):
        tree.draft([1], -1, 0.1)
    with pytest.raises(ValueError):
        tree.draft_batch([[1], [2]], [1, 2, 3], 0.1)
    assert 1 in tree and 2 not in tree
    assert tree.check_invariants() == ""


def test_concurrent_updates_and_drafts():
    # Calls run without the GIL; the tree's reader/writer lock keeps them consistent.
    rng = random.Random(13)
    seqs = [[rng.randrange(6) for _ in range(rng.randint(1, 200))] for _ in range(200)]
    tree, W = SuffixTree(32), 20
    done = threading.Event()
    errors = []

    def writer():
        try:
            for i, x in enumerate(seqs):
                tree.extend(i, x[: len(x) // 2])
                tree.extend(i, x[len(x) // 2:])
                tree.finish(i)
                if i >= W:
                    tree.remove(i - W)
        except Exception as e:  # surfaced below
            errors.append(e)
        finally:
            done.set()

    def reader(seed):
        r = random.Random(seed)
        try:
            while not done.is_set():
                x = r.choice(seqs)
                contexts = [x[: r.randrange(len(x) + 1)] for _ in range(50)]
                for d in tree.draft_batch(contexts, 6, 0.1):
                    assert len(d) <= 6
                tree.match(contexts[0])
        except Exception as e:
            errors.append(e)

    threads = [threading.Thread(target=writer)] + [
        threading.Thread(target=reader, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert tree.check_invariants() == ""
    fresh = SuffixTree(32)
    for i in range(len(seqs) - W, len(seqs)):
        fresh.insert(i, seqs[i])
    assert (tree.num_nodes(), tree.memory_bytes()) == (fresh.num_nodes(), fresh.memory_bytes())


def _other_thread_ran_during(call) -> tuple[bool, object]:
    """Run ``call()`` here while a second thread waits to run one line of Python: whether
    that line ran before ``call()`` returned here, and ``call()``'s result.

    The second thread is released (``go``) just before the call and then needs the GIL.
    While the switch interval is far longer than the call, this thread never hands the
    GIL over on its own between bytecodes (the interpreter asks it to only after the
    other thread has waited a whole interval), so the line can run first only if the
    call itself dropped the GIL.  Nothing here reads a clock."""
    go, ran = threading.Event(), []

    def other():
        go.wait()
        ran.append(True)

    thread = threading.Thread(target=other)
    thread.start()
    go.set()
    result = call()
    seen = bool(ran)               # read before this thread can give the GIL away again
    thread.join()
    assert ran                     # the line did run, before or after
    return seen, result


def assert_releases_gil(call, expected, what: str) -> None:
    """``call()`` (returning ``expected``) lets another Python thread run while it works
    (:func:`_other_thread_ran_during`, with a switch interval ~100x the call)."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(10.0)
    try:
        # The other thread needs the OS to schedule it while the call works: on a loaded
        # machine that can miss once, so a few tries (a count, not a time) decide.
        tries = []
        for _ in range(20):
            seen, out = _other_thread_ran_during(call)
            tries.append(seen)
            assert out == expected
            if seen:
                break
    finally:
        sys.setswitchinterval(interval)
    assert any(tries), f"no other Python thread ran during {what} in {len(tries)} calls"


@pytest.mark.parametrize("how", ["draft_batch", "draft_many"])
def test_drafting_releases_the_gil(how):
    # Node [0] gets 20k children, so each draft scans them all: a long call in C++ with
    # tiny inputs and outputs.  Another Python thread must be able to run while it works.
    n, k = 20000, 5000
    tree = SuffixTree(4)
    tree.insert(0, [tok for t in range(1, n + 1) for tok in (0, t)])
    contexts = [[0]] * k
    if how == "draft_batch":
        call = lambda: tree.draft_batch(contexts, 1, 0.0)            # noqa: E731
    else:
        call = lambda: draft_many([tree] * k, contexts, 1, 0.0)      # noqa: E731
    assert_releases_gil(call, [[1]] * k, how)


def _reference_backoff(tree: SuffixTree, context: list[int], b: int, min_prob: float,
                       alphabet: int):
    """Back-off by definition: the longest context suffix (<= max_depth - b) that occurs
    followed by some token, found by trying every length, longest first."""
    cap = max(tree.max_depth - b, 1)
    for k in range(min(len(context), cap), 0, -1):
        suffix = context[-k:]
        if tree.count(suffix) and any(tree.count(suffix + [t]) for t in range(alphabet)):
            return tree.draft(suffix, b, min_prob)
    return []


def test_backoff_drafts_from_the_longest_continued_suffix():
    rng = random.Random(7)
    for trial in range(60):
        tree = SuffixTree(max_depth=rng.choice([8, 16, 32]))
        alphabet = rng.randint(2, 6)
        for s in range(rng.randint(1, 5)):
            tree.insert(s, [rng.randrange(alphabet) for _ in range(rng.randint(5, 60))])
        own = [rng.randrange(alphabet) for _ in range(rng.randint(1, 40))]
        tree.extend(99, own)                          # the growing rollout itself
        for b in (1, 3, 8):
            got = tree.draft(own, b, 0.1, backoff=True)
            assert got == _reference_backoff(tree, own, b, 0.1, alphabet), (trial, b)
            assert draft_many([tree], [own], b, 0.1, backoff=True) == [got]
            plain = tree.draft(own, b, 0.1)
            if plain:                                 # a continued longest match: no change
                assert got == plain
