"""Outcome records: the wire format and the DARTS selection rules (pure functions)."""
import random

from vllm_rl.darts.rule import dual_end_selection, shortest_selection
from vllm_rl.darts.rule import annotate_group
from vllm_rl.outcome import Reason, RolloutInfo


def test_record_round_trips_through_stop_reason():
    info = RolloutInfo(Reason.DARTS_CANCELLED, length=17, weight=0.0, group_id="g", stop="###")
    wire = info.encode()
    assert wire.startswith("vllm_rl:") and RolloutInfo.decode(wire) == info
    assert RolloutInfo.decode(None) is None and RolloutInfo.decode("plain stop") is None
    assert RolloutInfo.decode(7) is None


def test_openai_choice_without_record_is_a_stock_sample():
    choice = {"finish_reason": "length", "stop_reason": None, "token_ids": [1, 2, 3]}
    info = RolloutInfo.from_openai_choice(choice)
    assert info.reason is Reason.LENGTH and info.length == 3 and info.weight == 1.0


def test_dual_end_is_k_shortest_and_l_longest_valid():
    rng = random.Random(0)
    for _ in range(300):
        n, m = rng.randint(1, 16), rng.randint(1, 8)
        k = rng.randint(0, m)
        lengths = [rng.randint(1, 50) for _ in range(n)]
        valid = [rng.random() < 0.8 for _ in range(n)]
        marks = dual_end_selection(lengths, valid, m, k)
        order = sorted((i for i in range(n) if valid[i]), key=lambda i: (lengths[i], i))
        if len(order) >= m:
            assert {i for i in range(n) if marks[i] == "short"} == set(order[:k])
            assert {i for i in range(n) if marks[i] == "long"} == set(order[len(order) - (m - k):])
        else:
            assert {i for i in range(n) if marks[i]} == set(order)
        assert all(marks[i] is None for i in range(n) if not valid[i])


def test_shortest_fills_with_cut_samples_but_never_cancelled_ones():
    lengths = [5, 9, 256, 256, 7]
    valid = [True, False, False, False, True]
    cancelled = [False, True, False, False, False]
    marks = shortest_selection(lengths, valid, 3, cancelled)
    assert marks == ["shortest", None, "shortest", None, "shortest"]


def test_annotate_zeroes_the_weight_of_unselected():
    infos = [RolloutInfo(Reason.EOS, n) for n in (3, 8, 5, 12)] + [RolloutInfo(Reason.LENGTH, 99)]
    out = annotate_group(infos, size=2, k=1, early_stop=False)
    assert [i.selection for i in out] == ["short", None, None, "long", None]
    assert [i.weight for i in out] == [1.0, 0.0, 0.0, 1.0, 0.0]
