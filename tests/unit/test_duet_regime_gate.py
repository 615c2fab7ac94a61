"""DUET's regime gate: the marker-less share at the gate, and a shut gate keeps at eps = 1."""
from __future__ import annotations

from vllm_rl.duet.engine import DuetEngine
from vllm_rl.duet.regime_gate import MARKERLESS_MAX, MarkerlessShare
from vllm_rl.duet.rule import Action, step
from vllm_rl.flags import DuetFlags
from vllm_rl.outcome import Reason


def test_the_share_decides_at_a_rounds_end_once_it_has_enough_samples():
    share = MarkerlessShare(window=100, min_samples=50)
    for i in range(49):
        share.observe(True)
    share.end_round()
    assert share.open and share.share is None            # the paper's gate until 50 samples
    share.observe(False)
    share.end_round()
    assert not share.open and share.share == 49 / 50
    for _ in range(100):                                   # the window forgets
        share.observe(False)
    assert share.count == 0 and len(share.bits) == 100
    assert share.open is False                             # decided only at a round's end
    share.end_round()
    assert share.open and share.share == 0.0


def test_the_threshold_is_the_papers():
    share = MarkerlessShare(window=200, min_samples=100)
    for i in range(100):
        share.observe(i < 6)
    share.end_round()
    assert share.share == MARKERLESS_MAX and share.open
    share.observe(True)
    share.end_round()
    assert share.share > MARKERLESS_MAX and not share.open


def _engine():
    engine = DuetEngine(lambda: None)
    engine._table = [bytes([65 + i % 26]) for i in range(64)]     # no token makes a marker
    return engine


def _run(engine, flags, seed):
    """One sample that never writes a marker, to its gate; what the engine records."""
    state = engine.admit(flags, max_tokens=100, seed=seed, prompt_token_ids=[1, 2],
                         request_id=str(seed))
    action = None
    for t in range(1, 40):
        action = step(state, t, [3] * t, engine.table) if t >= state.next_check else None
        if action is not None:
            break
    reason = Reason.DUET_ABORTED if action is Action.ABORT else Reason.EOS
    engine.observe(state, reason, t)
    engine.leave(state)
    return state, reason


def test_a_shut_regime_gate_keeps_every_sample_at_weight_one_and_records_why():
    engine = _engine()
    gated = DuetFlags(marker="qa", k1=0, k2=10, grace=5, eps=0.05, regime_gate=True)
    paper = DuetFlags(marker="qa", k1=0, k2=10, grace=5, eps=0.05)
    first = [_run(engine, gated, seed) for seed in range(256)]     # one sample per round
    assert all(s.gate_open for s, _ in first)                      # the paper's until 256
    assert sum(r is Reason.DUET_ABORTED for _, r in first) > 200
    assert engine.regimes["qa"].share == 1.0 and not engine.regimes["qa"].open
    state, reason = _run(engine, gated, 1000)
    assert not state.gate_open and state.markerless_share == 1.0
    assert reason is Reason.EOS and state.keep_prob == 1.0 and state.weight == 1.0
    assert not DuetEngine.tail(state)                              # stays in DARTS's pool
    assert DuetEngine.fields(state)["gate_open"] is False
    # a request that did not ask keeps the paper's gate whatever the share
    state, _ = _run(engine, paper, 1001)
    assert state.gate_open and state.keep_prob == 0.05
