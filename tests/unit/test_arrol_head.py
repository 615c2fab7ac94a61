"""ARRoL trainer side: head, training, calibration buffer, δ, cold start, voting, measures."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from vllm_rl import arrol as ctl
from vllm_rl.arrol.rule import Calibration, posterior, survival


def test_head_shape_and_export_round_trip():
    torch.manual_seed(0)
    head = ctl.QualityHead(32, activation="gelu")
    assert (head.fc1.in_features, head.fc1.out_features, head.fc2.out_features) == (32, 128, 1)
    x = torch.randn(6, 32)
    assert head(x).shape == (6,)
    s = head.score(x)
    assert s.dtype == torch.float32 and not s.requires_grad and ((s > 0) & (s < 1)).all()
    assert torch.allclose(s, torch.sigmoid(head(x)))
    state = head.export(5)
    assert set(state) == set(ctl.HEAD_KEYS) and state["version"] == 5
    assert (len(state["w1"]), len(state["w1"][0]), len(state["w2"])) == (128, 32, 128)
    ctl.check_head_state(state, hidden_size=32)
    wire = json.loads(json.dumps(state))                             # JSON-able
    assert torch.equal(ctl.QualityHead.from_state(wire).score(x), s)
    tensors = {**state, "w1": head.fc1.weight.detach(), "b1": head.fc1.bias.detach(),
               "w2": head.fc2.weight.detach()[0], "b2": head.fc2.bias.detach()[0]}
    assert torch.equal(ctl.QualityHead.from_state(tensors).score(x), s)


def test_check_head_state_names_the_key():
    state = ctl.QualityHead(8, width=4).export(0)
    for key, bad in (("w1", [[0.0] * 7] * 4), ("b1", [0.0] * 5), ("w2", [[0.0] * 4]),
                     ("b2", [1.0, 2.0]), ("activation", "tanh"), ("width", 0),
                     ("width", 4.0), ("hidden_size", True), ("version", -1),
                     ("version", "1"), ("w2", [float("nan")] * 4), ("b1", "abcd")):
        with pytest.raises(ValueError, match=f"'{key}'"):
            ctl.check_head_state({**state, key: bad})
    with pytest.raises(ValueError, match="'hidden_size'=8: allowed only .* 16"):
        ctl.check_head_state(state, hidden_size=16)
    with pytest.raises(ValueError, match="missing keys \\['b1'\\]"):
        ctl.check_head_state({k: v for k, v in state.items() if k != "b1"})
    with pytest.raises(ValueError, match="unknown keys \\['extra'\\]"):
        ctl.check_head_state({**state, "extra": 1})
    with pytest.raises(ValueError, match="mapping"):
        ctl.check_head_state([state])
    with pytest.raises(ValueError, match="activation"):
        ctl.QualityHead(8, activation="tanh")


def test_head_learns_deterministically_and_never_backprops_into_the_input():
    def run(seed):
        torch.manual_seed(seed)
        x = torch.randn(800, 16)
        y = (x[:, 0] + 0.5 * x[:, 1] > 0).float()
        x.requires_grad_(True)
        head = ctl.QualityHead(16)
        loss = ctl.HeadTrainer(head, lr=1e-2).fit(x, y, epochs=30, batch_size=100)
        assert x.grad is None
        return head, x.detach(), y, loss

    head, x, y, loss = run(0)
    assert ctl.auc(head.score(x).numpy(), y.numpy()) > 0.95 and loss < 0.3
    head2, _, _, loss2 = run(0)
    assert loss2 == loss and torch.equal(head2.fc1.weight, head.fc1.weight)

    # the hidden states come out of a "backbone": nothing reaches its weights (Sec. 4.3 (iii))
    backbone = torch.nn.Linear(4, 16)
    trainer = ctl.HeadTrainer(ctl.QualityHead(16), lr=1e-2)
    h = backbone(torch.randn(32, 4))
    before = [p.detach().clone() for p in trainer.head.parameters()]
    trainer.step(h, torch.randint(0, 2, (32,)))
    assert backbone.weight.grad is None and backbone.bias.grad is None
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.head.parameters()))
    with pytest.raises(ValueError, match="rewards"):
        trainer.step(h, torch.full((32,), 0.5))
    with pytest.raises(ValueError, match="rewards"):
        trainer.step(h, torch.ones(31))


def test_buffer_counts_prior_and_fifo_window():
    buf = ctl.CalibrationBuffer(window=4, bins=4)
    buf.add([0.1, 0.3, 0.6, 0.9, 0.95], [0, 1, 1, 0, 1])             # 0.1 falls out
    assert len(buf) == 4
    assert buf.counts() == ((0, 1, 1, 1), (0, 0, 0, 1))
    assert buf.prior == pytest.approx((3 + 1) / (4 + 2))
    assert buf.smoothed_prior(2.0) == pytest.approx((3 + 2) / (4 + 4))
    buf.add([0.0, 1.0], [True, False])                                 # 0.3, 0.6 fall out
    assert buf.counts() == ((1, 0, 0, 1), (0, 0, 0, 2))
    assert [s for s, _, _ in buf.items] == [0.9, 0.95, 0.0, 1.0]
    assert ctl.CalibrationBuffer(bins=4).prior == 0.5                  # empty: (0+1)/(0+2)
    for scores, labels, what in (([0.5], [0.5], "labels"), ([float("nan")], [1], "scores"),
                                 ([0.5, 0.6], [1], "labels")):
        with pytest.raises(ValueError, match=what):
            buf.add(scores, labels)
    assert len(buf) == 4                                               # nothing half-added


def test_solve_delta_matches_kappa():
    rng = np.random.default_rng(0)
    qs = rng.uniform(0, 1, 500)
    for kappa, lam in ((0.5, 0.5), (0.3, 0.5), (0.8, 2.0), (0.5, 0.0)):
        d = ctl.solve_delta(qs.tolist(), kappa, 0.5, lam, 0.1, 0.9)
        p = np.clip(kappa + d + lam * (0.5 - qs), 0.1, 0.9)
        assert p.mean() == pytest.approx(kappa, abs=1e-6)
        assert p.mean() == pytest.approx(np.mean([survival(q, d, kappa, 0.5, lam, 0.1, 0.9)
                                                  for q in qs]))


def test_solve_delta_by_hand():
    qs = [0.4, 0.5, 0.6, 0.7]                      # nothing clips: δ = λ(mean q − ρ)
    assert ctl.solve_delta(qs, 0.5, 0.5, 0.5, 0.1, 0.9) == pytest.approx(0.5 * (0.55 - 0.5))
    assert ctl.solve_delta(qs, 0.6, 0.3, 1.0, 0.1, 0.9) == pytest.approx(1.0 * (0.55 - 0.3))
    # a = κ + λ(ρ − q) = 1.1, 0.6, 0.1 (λ = 1): q = 0 clips at 0.9, the others do not,
    # (0.9 + 0.6 + δ + 0.1 + δ) / 3 = 0.6 gives δ = 0.1
    assert ctl.solve_delta([0.0, 0.5, 1.0], 0.6, 0.5, 1.0, 0.1, 0.9) == pytest.approx(0.1)
    # κ out of [p_min, p_max]: the nearest end, every p clipped there
    hi = ctl.solve_delta(qs, 0.95, 0.5, 0.5, 0.1, 0.9)
    assert hi == pytest.approx(0.9 - (0.95 + 0.5 * (0.5 - 0.7)))
    assert all(survival(q, hi, 0.95, 0.5, 0.5, 0.1, 0.9) == 0.9 for q in qs)
    lo = ctl.solve_delta(qs, 0.05, 0.5, 0.5, 0.1, 0.9)
    assert lo == pytest.approx(0.1 - (0.05 + 0.5 * (0.5 - 0.4)))
    assert all(survival(q, lo, 0.05, 0.5, 0.5, 0.1, 0.9) == pytest.approx(0.1) for q in qs)
    assert ctl.solve_delta([], 0.5, 0.5, 0.5, 0.1, 0.9) == 0.0
    with pytest.raises(ValueError, match="p_min"):
        ctl.solve_delta(qs, 0.5, 0.5, 0.5, 0.9, 0.1)
    with pytest.raises(ValueError, match="lam"):
        ctl.solve_delta(qs, 0.5, 0.5, -1.0, 0.1, 0.9)


def test_calibration_end_to_end():
    rng = np.random.default_rng(1)
    s = rng.uniform(0, 1, 3000)
    y = (rng.uniform(0, 1, 3000) < s).astype(float)
    buf = ctl.CalibrationBuffer()                                      # window 2048, B = 128
    buf.add(s.tolist(), y.tolist())
    assert len(buf) == 2048
    cal = buf.calibration(kappa=0.4, alpha=2.0)
    assert isinstance(cal, Calibration) and cal.bins == 128 and cal.alpha == 2.0
    assert (cal.pos, cal.neg) == buf.counts()
    assert sum(cal.pos) == int(y[-2048:].sum()) and sum(cal.pos) + sum(cal.neg) == 2048
    assert cal.prior == pytest.approx((y[-2048:].sum() + 2) / (2048 + 4))
    ps = [survival(posterior(cal, v), cal.delta, 0.4, 0.5, 0.5, 0.1, 0.9) for v in s[-2048:]]
    assert np.mean(ps) == pytest.approx(0.4, abs=1e-6)
    assert posterior(cal, 0.95) > 0.7 > 0.3 > posterior(cal, 0.05)
    assert Calibration.from_dict(json.loads(json.dumps(cal.to_dict()))) == cal
    empty = ctl.CalibrationBuffer().calibration()
    assert empty.delta == 0.0 and empty.prior == 0.5 and posterior(empty, 0.3) == 0.5


def test_weighted_counts_stand_for_what_the_coins_removed():
    """A survivor of a coin with propensity p counts 1/p in Eq. 1's counts, the prior and
    δ's mean: a buffer of survivors then calibrates like the full population it stands
    for (here every negative was kept with p = 1/4, each counting 4)."""
    rng = np.random.default_rng(2)
    s = rng.uniform(0, 1, 8000)
    y = (rng.uniform(0, 1, 8000) < s).astype(int)
    full = ctl.CalibrationBuffer(window=8000)
    full.add(s.tolist(), y.tolist())
    kept = (y == 1) | (rng.uniform(0, 1, 8000) < 0.25)
    ipw = ctl.CalibrationBuffer(window=8000)
    ipw.add(s[kept].tolist(), y[kept].tolist(), np.where(y[kept] == 1, 1.0, 4.0).tolist())
    plain = ctl.CalibrationBuffer(window=8000)
    plain.add(s[kept].tolist(), y[kept].tolist())
    assert ipw.prior == pytest.approx(full.prior, abs=0.02)
    assert plain.prior > full.prior + 0.15
    a, b, c = (buf.calibration(kappa=0.4) for buf in (full, ipw, plain))
    assert abs(b.delta - a.delta) < 0.02 < abs(c.delta - a.delta)
    assert all(isinstance(v, float) for v in b.pos)
    assert Calibration.from_dict(json.loads(json.dumps(b.to_dict()))) == b
    with pytest.raises(ValueError, match="weights"):
        ipw.add([0.5], [1], [0.0])
    with pytest.raises(ValueError, match="pos"):
        Calibration([-1.0] + [0.0] * 127, [0] * 128, 1.0, 0.5, 0.0)


def test_cold_start():
    cs, buf = ctl.ColdStart(steps=2), ctl.CalibrationBuffer()
    buf.add([0.2, 0.8], [0, 1])
    cal = buf.calibration()
    assert cs.active and cs.calibration(buf) is None and cs.calibration(cal) is None
    cs.tick()
    assert cs.active and cs.calibration(buf) is None
    cs.tick()
    assert not cs.active
    assert cs.calibration(buf, kappa=0.5) == cal and cs.calibration(cal) is cal
    assert not ctl.ColdStart(steps=0).active
    assert ctl.ColdStart().steps == 20
    with pytest.raises(ValueError, match="steps"):
        ctl.ColdStart(steps=-1)


def test_rank_weights_and_weighted_vote():
    assert ctl.rank_weights([]) == []
    assert ctl.rank_weights([0.3]) == [1.0]
    assert ctl.rank_weights([0.1, 0.9, 0.5]) == [0.0, 1.0, 0.5]
    assert ctl.rank_weights([0.2, 0.2, 0.9]) == [0.25, 0.25, 1.0]
    assert ctl.rank_weights([0.4, 0.4]) == [0.5, 0.5]
    # majority says "a" (3 votes), but its candidates rank low: 0 + 0.25 + 0.5 < 0.75 + 1
    assert ctl.weighted_vote(["a", "a", "a", "b", "b"], [0.1, 0.2, 0.3, 0.4, 0.5]) == "b"
    assert ctl.weighted_vote(["a", "a", "a", "b", "b"], [0.3, 0.4, 0.5, 0.1, 0.2]) == "a"
    assert ctl.weighted_vote(["x", "y"], [0.5, 0.5]) == "x"             # tie: first seen
    # 0 + 1 = 1/3 + 2/3: a tie, "y" occurs first
    assert ctl.weighted_vote(["y", "x", "x", "y"], [0.1, 0.2, 0.3, 0.4]) == "y"
    assert ctl.weighted_vote([42], [0.0]) == 42
    with pytest.raises(ValueError):
        ctl.weighted_vote([], [])
    with pytest.raises(ValueError, match="scores"):
        ctl.weighted_vote(["a", "b"], [0.1])


def test_measures_by_hand():
    assert ctl.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert ctl.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # ranks (0, 1.5, 1.5, 3) vs (0, 1, 2, 3): 4.5 / sqrt(4.5 * 5) = sqrt(0.9)
    assert ctl.spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(math.sqrt(0.9))
    assert ctl.spearman([1, 1, 1], [1, 2, 3]) == 0.0                   # undefined: 0
    assert ctl.spearman([0.2, 0.9, 0.4, 0.7], [0, 1, 0, 1]) == pytest.approx(
        np.corrcoef([0, 3, 1, 2], [0.5, 2.5, 0.5, 2.5])[0, 1])
    assert ctl.auc([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1]) == pytest.approx(0.75)
    # pairs (pos, neg): (.5,.5) = 1/2, (.5,.2), (.9,.5), (.9,.2) = 1 each: 3.5 / 4
    assert ctl.auc([0.5, 0.5, 0.2, 0.9], [1, 0, 0, 1]) == pytest.approx(0.875)
    assert ctl.auc([0.5, 0.5], [0, 1]) == pytest.approx(0.5)
    assert ctl.auc([0.1, 0.2], [1, 1]) == 0.5                          # one class: 0.5
    assert ctl.auc([0.9, 0.1, 0.3], [0, 1, 1]) == 0.0
    assert ctl.trace_confidence([-1.0, -3.0]) == pytest.approx(2.0)
    assert ctl.trace_confidence([0.0]) == 0.0
    with pytest.raises(ValueError):
        ctl.trace_confidence([])
