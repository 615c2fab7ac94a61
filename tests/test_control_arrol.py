"""ARRoL trainer side: head, training, calibration buffer, δ, cold start, voting, measures."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from vllm_rl.control import arrol as ctl
from vllm_rl.engine.policies.arrol import posterior


def test_head_state_round_trip_and_checks():
    torch.manual_seed(0)
    head = ctl.QualityHead(32, activation="gelu")
    state = head.export(5)
    ctl.check_head_state(state, hidden_size=32)
    x = torch.randn(6, 32)
    assert torch.equal(ctl.QualityHead.from_state(state).score(x), head.score(x))
    for key, bad in (("w1", [[0.0] * 31] * 128), ("b2", [1.0, 2.0]), ("activation", "tanh"),
                     ("width", 0)):
        with pytest.raises(ValueError, match=key):
            ctl.check_head_state({**state, key: bad})
    with pytest.raises(ValueError, match="hidden_size"):
        ctl.check_head_state(state, hidden_size=64)
    with pytest.raises(ValueError, match="missing"):
        ctl.check_head_state({k: v for k, v in state.items() if k != "b1"})


def test_head_learns_and_never_backprops_into_the_input():
    torch.manual_seed(0)
    x = torch.randn(800, 16)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).float()
    x.requires_grad_(True)
    head = ctl.QualityHead(16)
    ctl.HeadTrainer(head, lr=1e-2).fit(x, y, epochs=30, batch_size=100)
    assert x.grad is None
    assert ctl.auc(head.score(x.detach()).numpy(), y.numpy()) > 0.95


def test_buffer_counts_prior_and_window():
    buf = ctl.CalibrationBuffer(window=4, bins=4)
    buf.add([0.1, 0.3, 0.6, 0.9, 0.95], [0, 1, 1, 0, 1])             # 0.1 falls out
    assert buf.counts() == ((0, 1, 1, 1), (0, 0, 0, 1))
    assert buf.prior == pytest.approx((3 + 1) / (4 + 2))


def test_solve_delta():
    rng = np.random.default_rng(0)
    qs = rng.uniform(0, 1, 500).tolist()
    d = ctl.solve_delta(qs, 0.5, 0.5, 0.5, 0.1, 0.9)
    assert np.clip(0.5 + d + 0.5 * (0.5 - np.asarray(qs)), 0.1, 0.9).mean() == \
        pytest.approx(0.5, abs=1e-6)
    qs = [0.4, 0.5, 0.6, 0.7]                                          # nothing clips
    assert ctl.solve_delta(qs, 0.5, 0.5, 0.5, 0.1, 0.9) == pytest.approx(0.5 * (0.55 - 0.5))
    assert ctl.solve_delta(qs, 0.95, 0.5, 0.5, 0.1, 0.9) > 0           # unattainable: clip high
    assert ctl.solve_delta([], 0.5, 0.5, 0.5, 0.1, 0.9) == 0.0


def test_calibration_keeps_kappa_over_the_buffer():
    rng = np.random.default_rng(1)
    s = rng.uniform(0, 1, 1000)
    y = (rng.uniform(0, 1, 1000) < s).astype(float)
    buf = ctl.CalibrationBuffer()
    buf.add(s.tolist(), y.tolist())
    cal = buf.calibration(kappa=0.4)
    ps = [min(0.9, max(0.1, 0.4 + cal.delta + 0.5 * (0.5 - posterior(cal, v)))) for v in s]
    assert np.mean(ps) == pytest.approx(0.4, abs=1e-6)
    assert posterior(cal, 0.95) > posterior(cal, 0.05)


def test_cold_start():
    cs, buf = ctl.ColdStart(steps=2), ctl.CalibrationBuffer()
    buf.add([0.2, 0.8], [0, 1])
    assert cs.active and cs.calibration(buf) is None
    cs.tick()
    cs.tick()
    assert not cs.active and cs.calibration(buf, kappa=0.5) is not None


def test_weighted_vote_and_measures():
    assert ctl.rank_weights([0.3]) == [1.0]
    assert ctl.rank_weights([0.1, 0.9, 0.5]) == [0.0, 1.0, 0.5]
    assert ctl.rank_weights([0.2, 0.2, 0.9]) == [0.25, 0.25, 1.0]
    # majority says "a" (3 votes), but its candidates rank low: 0 + 0.25 + 0.5 < 0.75 + 1
    assert ctl.weighted_vote(["a", "a", "a", "b", "b"], [0.1, 0.2, 0.3, 0.4, 0.5]) == "b"
    assert ctl.weighted_vote(["x", "y"], [0.5, 0.5]) == "x"
    assert ctl.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert ctl.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert ctl.auc([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1]) == pytest.approx(0.75)
    assert ctl.auc([0.5, 0.5], [0, 1]) == pytest.approx(0.5)
    assert ctl.trace_confidence([-1.0, -3.0]) == pytest.approx(2.0)
