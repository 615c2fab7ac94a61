"""Outcome records: the wire format and the DARTS selection rules (pure functions)."""
import random

from vllm_rl.darts.rule import dual_end_selection, shortest_selection
from vllm_rl.darts.rule import annotate_group
from vllm_rl.outcome import Reason, RolloutInfo


def test_record_round_trips_through_its_carrier_and_json():
    import json

    info = RolloutInfo(Reason.DARTS_CANCELLED, length=17, weight=0.0, group_id="g", stop="###")
    wire = info.encode()
    assert wire.startswith("vllm_rl:") and RolloutInfo.decode(wire) == info
    record = json.loads(json.dumps(info.to_json()))        # choices[i].rollout_info
    assert record["reason"] == "darts_cancelled" and RolloutInfo.from_json(record) == info
    choice = {"finish_reason": "stop", "stop_reason": "###", "rollout_info": record}
    assert RolloutInfo.from_openai_choice(choice) == info
    assert RolloutInfo.decode(None) is None and RolloutInfo.decode("plain stop") is None
    assert RolloutInfo.decode(7) is None


def test_the_schedulers_carrier_is_the_records_own_encoding():
    """RolloutInfo.carrier (what the scheduler writes per ending sample, no record built)
    gives exactly encode()'s text: the same fields, order and defaults, for any subset of
    the wire fields; an unknown field or a missing required one is an error."""
    import pytest

    from vllm_rl.outcome import _WIRE

    rng = random.Random(5)
    optional = [name for name in _WIRE if name not in ("reason", "length")]
    values = {"weight": 0.25, "group_id": "g", "finish_rank": 3, "selected": True,
              "selection": "short", "stop": 7, "trace": [-0.5, 1.0],
              "weight_versions": [[0, 0], [1, 5]]}
    for _ in range(200):
        kw = {"reason": rng.choice(list(Reason)), "length": rng.randrange(1000)}
        for name in rng.sample(optional, rng.randrange(len(optional) + 1)):
            kw[name] = values.get(name, rng.choice([None, 0, 1, 0.5, "x"]))
        assert RolloutInfo.carrier(**kw) == RolloutInfo(**kw).encode()
    with pytest.raises(TypeError):
        RolloutInfo.carrier(reason=Reason.EOS, length=1, hidden=[1.0])   # in-process only
    with pytest.raises(TypeError):
        RolloutInfo.carrier(reason=Reason.EOS)


def test_a_record_is_compact_and_never_carries_a_hidden_state():
    """With return_hidden the record names the worker's vector (hidden_id) and holds it
    in-process only: the wire form has no hidden text, and decoding one (an old engine's)
    takes none from it."""
    import json

    import numpy as np

    vec = np.arange(4096, dtype=np.float32) / 7
    info = RolloutInfo(Reason.EOS, length=40, score=0.3, head_version=2, hidden_id="7_req-3",
                       trace=[-0.5, -2.0, 1.2]).with_hidden(vec)
    assert info.hidden_state() is not None and info.hidden_state().dtype == np.float32
    wire = info.encode()
    body = json.loads(wire[len("vllm_rl:"):])
    assert "hidden" not in body and body["hidden_id"] == "7_req-3"
    assert len(wire) < 200                                   # not 4096 floats of text
    back = RolloutInfo.decode(wire)
    assert back == info and back.hidden_state() is None and back.hidden_id == "7_req-3"
    legacy = wire[:-1] + ',"hidden":"AACAPw=="}'
    assert RolloutInfo.decode(legacy).hidden is None
    assert "hidden=" not in repr(info).replace("hidden_id=", "")


def test_hidden_states_are_attached_by_their_id():
    import numpy as np

    from vllm_rl.outcome import decode_hidden, encode_hidden, hidden_ids, with_hidden

    vec = np.array([1.5, -2.0, 0.0], dtype=np.float32)
    a = RolloutInfo(Reason.EOS, length=9, hidden_id="a")
    b = RolloutInfo(Reason.ARROL_PRUNED, length=8, hidden_id="b")
    plain = RolloutInfo(Reason.EOS, length=3)
    infos = [a, None, plain, b, a]
    assert hidden_ids(infos) == ["a", "b"]                   # each once, in order
    got = with_hidden(infos, {"a": vec, "b": encode_hidden(vec * 2)})
    np.testing.assert_array_equal(got[0].hidden_state(), vec)
    np.testing.assert_array_equal(got[3].hidden_state(), vec * 2)   # the route's text form
    assert got[1] is None and got[2] is plain and hidden_ids(got) == []
    missing = with_hidden([b], {})                            # dropped by the worker's store
    assert missing[0] is b and missing[0].hidden_state() is None
    np.testing.assert_array_equal(decode_hidden(encode_hidden(vec)), vec)


def test_generate_takes_the_named_hidden_states_in_one_call():
    """vllm_rl.LLM.generate (attach_rollout_info with fetch_hidden): the records whose
    hidden_id is set get their vectors, every prompt's in one call."""
    from types import SimpleNamespace

    import numpy as np

    from vllm_rl.llm import attach_rollout_info

    def completion(info):
        return SimpleNamespace(stop_reason=None, rollout_info=info, finish_reason="stop",
                               token_ids=[1])

    outs = [SimpleNamespace(request_id=f"r{i}", outputs=[
        completion(RolloutInfo(Reason.EOS, length=5, score=0.1, hidden_id=f"{j}_r{i}"))
        for j in range(2)]) for i in range(2)]
    outs.append(SimpleNamespace(request_id="stock", outputs=[
        SimpleNamespace(stop_reason=None, finish_reason="length", token_ids=[1, 2])]))
    calls = []

    def fetch(ids):
        calls.append(list(ids))
        return {rid: np.full(3, float(k), dtype=np.float32) for k, rid in enumerate(ids)}

    attach_rollout_info(outs, [None] * len(outs), fetch_hidden=fetch)
    assert calls == [["0_r0", "1_r0", "0_r1", "1_r1"]]
    got = [c.rollout_info.hidden_state() for o in outs[:2] for c in o.outputs]
    assert [float(h[0]) for h in got] == [0.0, 1.0, 2.0, 3.0]
    assert outs[2].outputs[0].rollout_info.hidden_state() is None
    attach_rollout_info(outs[2:], [None], fetch_hidden=fetch)   # nothing named: no call
    assert len(calls) == 1


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
