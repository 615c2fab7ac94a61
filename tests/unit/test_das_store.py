"""The DAS tree store (vllm_rl.das.store): windows, the global cap, clearing, memory."""
import random

from vllm_rl.das.store import ProblemTrees
from vllm_rl.das.tree import SuffixTree


def _rollout(rng, n=30):
    return [rng.randrange(50) for _ in range(n)]


def test_online_rollouts_are_sealed_into_their_problem():
    store = ProblemTrees(window=4)
    a = store.start("A", [1, 2, 3])
    store.extend("A", a, [4, 5])
    store.extend("A", a, [6])
    assert store.problems["A"].growing == {a} and store.stored_tokens == 6
    store.finish("A", a, output_len=3)
    p = store.problems["A"]
    assert not p.growing and list(p.finished) == [a] and store.lengths("A") == [3]
    assert list(store.sequences("A")) == [[1, 2, 3, 4, 5, 6]]
    assert "B" not in store.problems


def test_window_keeps_the_last_w_rollouts_per_problem():
    rng = random.Random(0)
    store = ProblemTrees(window=3)
    kept = []
    for i in range(7):
        r = _rollout(rng, 10 + i)
        store.insert("A", r)
        kept.append(r)
        store.insert("B", _rollout(rng))
    assert sorted(map(tuple, store.sequences("A"))) == sorted(map(tuple, kept[-3:]))
    assert store.lengths("A") == [14, 15, 16]
    assert len(store.problems["B"].finished) == 3
    assert store.stored_tokens == sum(map(len, kept[-3:])) + 3 * 30


def test_deferred_removals_leave_the_trees_the_windows_keep():
    """With ``defer_removals`` (the drafter's feeder thread) the windows and sizes count a
    dropped rollout out at once, its tree keeps it until ``remove(take_removals())``,
    and then every tree equals the one removing at once built, including a problem
    dropped whole (its last rollout gone) meanwhile."""
    rng = random.Random(2)
    now, later = ProblemTrees(window=2, max_stored_tokens=150), ProblemTrees(
        window=2, max_stored_tokens=150)
    later.defer_removals = True
    trees = {}
    for i in range(9):
        pid, r = f"P{i % 3}", _rollout(rng, 10 + i)
        for store in (now, later):
            store.insert(pid, r)
        trees[pid] = later.problems[pid].tree
        assert later.stored_tokens == now.stored_tokens
        assert {k: list(p.finished) for k, p in later.problems.items()} == {
            k: list(p.finished) for k, p in now.problems.items()}
    doomed = later.take_removals()
    assert doomed and later.take_removals() == []
    assert sum(t.num_sequences() for t in trees.values()) > sum(
        p.tree.num_sequences() for p in now.problems.values())
    ProblemTrees.remove(doomed)
    for pid, tree in trees.items():
        want = sorted(map(tuple, now.sequences(pid)))
        assert sorted(tuple(tree.sequence(s)) for s in tree.sequences()) == want


def test_global_cap_drops_oldest_finished_first_never_a_growing_one():
    rng = random.Random(1)
    store = ProblemTrees(window=16, max_stored_tokens=100)
    g = store.start("G", [])
    store.extend("G", g, _rollout(rng, 40))
    for i in range(6):
        store.insert(f"P{i}", _rollout(rng, 20))
    assert store.stored_tokens <= 100
    assert store.problems["G"].growing == {g}                  # never evicted
    assert set(store.problems) == {"G", "P3", "P4", "P5"}      # oldest left first
    assert store.stored_tokens == 40 + 3 * 20


def test_clear_one_or_all_and_memory_returns_to_base():
    rng = random.Random(2)
    base = SuffixTree(64).memory_bytes()
    store = ProblemTrees(window=8)
    for pid in ("A", "B"):
        for _ in range(8):
            store.insert(pid, _rollout(rng, 50))
    live = store.start("A", [9])
    store.extend("A", live, [1, 2, 3])
    tree_a = store.problems["A"].tree
    for seq in list(store.problems["A"].finished):      # the window slides everything out
        store.insert("A", _rollout(rng, 50))
    assert store.clear("B") == 1 and "B" not in store.problems
    assert store.stored_tokens == 8 * 50 + 4
    store.finish("A", live, 3)
    assert store.clear() == 1 and store.problems == {} and store.stored_tokens == 0
    store.extend("A", live, [7])                         # a cleared rollout feeds nothing
    assert store.stored_tokens == 0
    for seq in tree_a.sequences():
        tree_a.remove(seq)
    assert tree_a.memory_bytes() == base


def test_a_problem_without_rollouts_is_dropped():
    store = ProblemTrees(window=1)
    s = store.start("A", [])
    store.finish("A", s, 0)                              # nothing was generated
    assert "A" not in store.problems and store.stored_tokens == 0


def test_the_feeders_removals_run_even_when_a_feed_fails():
    """The drafter's feeder call (``drafter._background``) feeds, then removes; a feed
    that raises still leaves the removals done (the windows already count them out),
    and the error reaches the waiter."""
    import pytest

    from vllm_rl.das.drafter import _background

    store = ProblemTrees(window=1)
    store.defer_removals = True
    rng = random.Random(3)
    store.insert("A", _rollout(rng))
    store.insert("A", _rollout(rng))          # drops the first
    tree = store.problems["A"].tree
    doomed = store.take_removals()
    assert tree.num_sequences() == 2 and len(doomed) == 1

    def fails():
        raise RuntimeError("feed failed")

    with pytest.raises(RuntimeError, match="feed failed"):
        _background([fails], doomed)
    assert tree.num_sequences() == 1
