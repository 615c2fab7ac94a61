"""The DAS drafter's context windows under async scheduling (:mod:`vllm_rl.das.context`):
each row always ends like the whole context, at least ``depth`` tokens of it, so the
tree (which reads only the last ``max_depth`` tokens) drafts as from the whole context."""
import numpy as np

from vllm_rl.das.context import ContextWindows
from vllm_rl.das.tree import SuffixTree


def _steps(rng, n_slots, depth, max_new, steps):
    win = ContextWindows(depth, max_new, capacity=2)        # grows
    full, prompts = {}, []
    shared = [rng.integers(0, 50, rng.integers(0, 3 * depth)).tolist()
              for _ in range(n_slots // 2 + 1)]
    for s in range(n_slots):
        # two samples share one prompt list, the second reading a shorter prefix of it
        prompt = shared[s // 2]
        n = len(prompt) - (s % 2) * min(len(prompt), 3)
        prompts.append((prompt, n))
        full[s] = prompt[:n]
    win.start_many(np.arange(n_slots)[::-1].copy(), prompts[::-1])
    for step in range(steps):
        slots = rng.permutation(n_slots + 2) - 2             # rows without a slot: -1, -2
        slots = np.where(slots < 0, -1, slots)
        # every other step one token or none per row (a step without drafts)
        counts = rng.integers(0, (max_new if step % 2 else 1) + 1, len(slots))
        offsets = np.zeros(len(slots) + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        tokens = rng.integers(0, 50, int(offsets[-1])).astype(np.int32)
        win.append(slots, tokens, offsets)
        for i, s in enumerate(slots.tolist()):
            if s >= 0:
                full[s] += tokens[offsets[i]:offsets[i + 1]].tolist()
        yield win, full


def test_windows_end_like_the_whole_context():
    rng = np.random.default_rng(0)
    depth = 8
    for win, full in _steps(rng, 12, depth, 5, 200):
        ctx, lens = win.view(np.arange(12))
        for s in range(12):
            want = full[s][-max(depth, int(lens[s])):]
            assert int(lens[s]) >= min(depth, len(full[s]))
            assert ctx[s, :lens[s]].tolist() == full[s][len(full[s]) - int(lens[s]):]
            assert ctx[s, :lens[s]].tolist()[-depth:] == want[-depth:]
    ctx, lens = win.view(np.array([-1, 3]))
    assert lens[0] == 0 and lens[1] == win.length[3]


def test_a_draft_from_the_window_equals_the_draft_from_the_whole_context():
    rng = np.random.default_rng(1)
    depth = 16
    tree = SuffixTree(depth)
    for i in range(6):
        tree.insert(i, rng.integers(0, 6, 300).tolist())
    for win, full in _steps(rng, 6, depth, 9, 60):
        ctx, lens = win.view(np.arange(6))
        for s in range(6):
            for backoff in (False, True):
                whole = tree.draft_info(full[s], 8, 0.1, backoff)
                part = tree.draft_info(ctx[s, :lens[s]].tolist(), 8, 0.1, backoff)
                assert (whole.tokens, whole.match_len) == (part.tokens, part.match_len)
