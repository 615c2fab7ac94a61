"""ARRoL's pruning rule in the engine (App. A.4 Eq. 1, Bayes, Eq. 2; Alg. 1 l.17-21)."""
from __future__ import annotations

import json
import math
import random
from types import SimpleNamespace

import pytest

from vllm_rl.arrol import rule
from vllm_rl.duet.rule import seeded_coin

FLAGS = SimpleNamespace(kappa=0.5, rho=0.5, lam=0.5, p_min=0.1, p_max=0.9)

# B = 4, alpha = 1, prior 1/4: Σc+ = 6, Σc- = 6, so P(b|Y) = (c_b + 1) / (6 + 4)
POS, NEG = (0, 1, 2, 3), (3, 2, 1, 0)
TINY = rule.Calibration(pos=POS, neg=NEG, alpha=1.0, prior=0.25, delta=0.0, bins=4)


def test_bin_of_edges():
    assert rule.BINS == 128
    assert rule.bin_of(0.0) == 0 and rule.bin_of(1.0) == rule.BINS - 1
    for k in range(rule.BINS):                      # exactly k/B opens bin k
        assert rule.bin_of(k / rule.BINS) == k
        assert rule.bin_of(math.nextafter(k / rule.BINS, -1.0)) == max(k - 1, 0)
    assert rule.bin_of(math.nextafter(1.0, 0.0)) == rule.BINS - 1
    assert [rule.bin_of(s, 4) for s in (0.0, 0.2499, 0.25, 0.5, 0.75, 0.999, 1.0)] == \
        [0, 0, 1, 2, 3, 3, 3]
    assert rule.bin_of(-3.0, 4) == 0 and rule.bin_of(7.0, 4) == 3       # clipped into [0, 1]
    assert rule.bin_of(float("nan"), 4) == 0
    assert rule.bin_of(0.7, 1) == 0


def test_likelihoods_and_posterior_by_hand():
    for b in range(4):
        s = (b + 0.5) / 4
        l1, l0 = rule.likelihoods(TINY, s)
        assert (l1, l0) == pytest.approx(((POS[b] + 1) / 10, (NEG[b] + 1) / 10))
        assert rule.posterior(TINY, s) == pytest.approx(0.25 * l1 / (0.25 * l1 + 0.75 * l0))
    # the bins written out: q_b = (1/4)(c+ + 1) / ((1/4)(c+ + 1) + (3/4)(c- + 1))
    assert [rule.posterior(TINY, (b + 0.5) / 4) for b in range(4)] == \
        pytest.approx([1 / 13, 2 / 11, 3 / 9, 4 / 7])
    assert sum(rule.likelihoods(TINY, (b + 0.5) / 4)[0] for b in range(4)) == pytest.approx(1)
    # B = 2, alpha = 2, prior 1/2: Σc+ + αB = 4 + 4, Σc- + αB = 0 + 4
    cal = rule.Calibration((4, 0), (0, 0), 2.0, 0.5, 0.0, 2)
    assert rule.likelihoods(cal, 0.2) == pytest.approx((6 / 8, 2 / 4))
    assert rule.posterior(cal, 0.2) == pytest.approx(0.75 / 1.25)
    assert rule.posterior(cal, 0.9) == pytest.approx(0.25 / 0.75)


def test_survival_is_eq2_clipped():
    assert rule.survival(0.5, 0.0, 0.5, 0.5, 0.5, 0.1, 0.9) == pytest.approx(0.5)
    assert rule.survival(0.1, 0.05, 0.5, 0.5, 0.5, 0.1, 0.9) == pytest.approx(0.75)
    assert rule.survival(0.9, 0.0, 0.5, 0.3, 2.0, 0.1, 0.9) == pytest.approx(0.1)  # clip low
    assert rule.survival(0.0, 0.5, 0.5, 0.5, 0.5, 0.1, 0.9) == 0.9                  # clip high
    assert rule.survival(1.0, -0.5, 0.5, 0.5, 0.5, 0.1, 0.9) == 0.1
    assert rule.survival(0.3, 0.0, 0.5, 0.5, 0.0, 0.0, 1.0) == pytest.approx(0.5)   # λ = 0


def test_decide_cold_start_never_prunes():
    for coin in (0.0, 0.5, 0.999999):
        for s in (0.0, 0.3, 1.0):
            v = rule.decide(s, None, FLAGS, coin)
            assert v == rule.Verdict(s, None, None, False)


def test_decide_kept_iff_coin_below_p():
    for b in range(4):
        s = (b + 0.5) / 4
        q = rule.posterior(TINY, s)
        p = rule.survival(q, 0.0, 0.5, 0.5, 0.5, 0.1, 0.9)
        for coin in (0.0, p - 1e-12, p, p + 1e-12, 0.999):
            v = rule.decide(s, TINY, FLAGS, coin)
            assert (v.score, v.q, v.p) == (s, q, p)
            assert v.pruned is (coin >= p)


def test_inside_darts_p_acts_on_the_redundancy():
    """p' = s + (1 - s) p with s = M/M': its mean over a group whose p has mean κ is
    κ' = M/M' + κ(1 - M/M') exactly, its range holds κ' whenever [p_min, p_max] holds κ
    (p_max = 0.9 could not reach κ' = 0.944 by composing κ alone), and without
    redundancy nothing changes."""
    assert rule.darts_share(4, 8) == 0.5 and rule.darts_share(4, 4) == 0.0
    assert rule.composed_survival(0.3, 0.0) == 0.3
    m, n = 8, 9
    share = rule.darts_share(m, n)
    ps = [0.1, 0.2, 0.5, 0.8, 0.9]              # mean 0.5 = κ
    kappa_prime = rule.composed_kappa(0.5, m, n)
    assert kappa_prime == pytest.approx(m / n + 0.5 / n)
    mean = sum(rule.composed_survival(p, share) for p in ps) / len(ps)
    assert mean == pytest.approx(kappa_prime)
    assert rule.composed_survival(FLAGS.p_min, share) < kappa_prime
    assert rule.composed_survival(FLAGS.p_max, share) > kappa_prime > FLAGS.p_max
    for b in range(4):
        s = (b + 0.5) / 4
        alone = rule.decide(s, TINY, FLAGS, 0.5)
        v = rule.decide(s, TINY, FLAGS, 0.5, share)
        assert v.p == pytest.approx(share + (1 - share) * alone.p)
        assert v.pruned is (0.5 >= v.p)


def test_coin_is_seeded_and_its_own():
    a = rule.prune_coin(7, [1, 2, 3], "r1")
    assert 0.0 <= a < 1.0
    assert a == rule.prune_coin(7, [1, 2, 3], "r1") == rule.prune_coin(7, [1, 2, 3], "r2")
    assert a != rule.prune_coin(8, [1, 2, 3], "r1")
    assert a != rule.prune_coin(7, [1, 2, 4], "r1")
    assert a != seeded_coin(7, [1, 2, 3], "r1")                       # not DUET's coin
    assert rule.prune_coin(None, [1], "x") == rule.prune_coin(None, [2], "x")
    assert rule.prune_coin(None, [1], "x") != rule.prune_coin(None, [1], "y")
    assert rule.prune_coin(None, [1], "x") != seeded_coin(None, [1], "x")
    coins = [rule.prune_coin(seed, [5, 6], "r") for seed in range(2000)]
    assert len(set(coins)) == len(coins)                               # different seeds
    duet = [seeded_coin(seed, [5, 6], "r") for seed in range(2000)]
    # independent of DUET's coin: the correlation of 2000 pairs is within ~4.5 sigma of 0
    mc, md = sum(coins) / 2000, sum(duet) / 2000
    cov = sum((c - mc) * (d - md) for c, d in zip(coins, duet)) / 2000
    assert abs(cov / (1 / 12)) < 0.1


def _binom_two_sided(k: int, n: int, p: float) -> float:
    """Exact two-sided binomial p-value: the mass of outcomes no likelier than k."""
    logs = [math.log(math.comb(n, j)) + j * math.log(p) + (n - j) * math.log1p(-p)
            for j in range(n + 1)]
    pmf = [math.exp(x) for x in logs]
    return min(1.0, math.fsum(x for x in pmf if x <= pmf[k] * (1 + 1e-9)))


def test_binomial_helper():
    # n = 4, p = 1/2: pmf 1, 4, 6, 4, 1 (/16); P-value of k = 0 is 2/16, of k = 1 is 10/16
    assert _binom_two_sided(0, 4, 0.5) == pytest.approx(2 / 16)
    assert _binom_two_sided(1, 4, 0.5) == pytest.approx(10 / 16)
    assert _binom_two_sided(2, 4, 0.5) == pytest.approx(1.0)


def test_kept_share_is_binomial_in_p():
    """A fixed calibration, many samples with seeded coins: in every bin the kept count is
    Binomial(N_b, p_b) (exact two-sided test), and overall Poisson-binomial in the p's."""
    cal = rule.Calibration((1, 2, 5, 20), (20, 5, 2, 1), 1.0, 0.5, 0.05, 4)
    rng = random.Random(0)
    kept = [0] * 4
    tried = [0] * 4
    ps = [None] * 4
    for i in range(8000):
        s = rng.random()
        v = rule.decide(s, cal, FLAGS, rule.prune_coin(i, [5, 6], "r"))
        b = rule.bin_of(s, 4)
        tried[b] += 1
        kept[b] += not v.pruned
        ps[b] = v.p
    assert len(set(ps)) == 4 and min(ps) > 0.1 and max(ps) < 0.9      # four distinct p's
    for k, n, p in zip(kept, tried, ps):
        assert _binom_two_sided(k, n, p) > 1e-3, (k, n, p)
    mean = sum(n * p for n, p in zip(tried, ps))
    var = sum(n * p * (1 - p) for n, p in zip(tried, ps))
    assert abs(sum(kept) - mean) < 4 * math.sqrt(var)


def test_calibration_checks_name_the_field():
    good = dict(pos=[0] * 4, neg=[0] * 4, alpha=1.0, prior=0.5, delta=0.0, bins=4)
    for key, bad in (("alpha", 0.0), ("alpha", float("inf")), ("prior", 1.0),
                     ("prior", 0.0), ("pos", [0] * 3), ("pos", [float("nan")] * 4), ("neg", [-1] * 4),
                     ("neg", "abcd"), ("delta", float("nan")), ("bins", 0), ("bins", 2.0),
                     ("alpha", True)):
        with pytest.raises(ValueError, match=f"Calibration.{key}"):
            rule.Calibration.from_dict({**good, key: bad})
    with pytest.raises(ValueError, match="allowed a float in \\(0, 1\\)"):
        rule.Calibration.from_dict({**good, "prior": 1.5})
    with pytest.raises(ValueError, match="unknown keys \\['beta'\\]"):
        rule.Calibration.from_dict({**good, "beta": 1})
    with pytest.raises(ValueError, match="missing keys \\['delta'\\]"):
        rule.Calibration.from_dict({k: v for k, v in good.items() if k != "delta"})
    with pytest.raises(ValueError, match="mapping"):
        rule.Calibration.from_dict([1, 2])
    cal = rule.Calibration.from_dict(good)
    assert cal.pos == (0,) * 4 and isinstance(cal.pos, tuple) and cal.auc is None
    with_auc = rule.Calibration.from_dict({**good, "auc": 0.72})
    assert with_auc.auc == 0.72 and with_auc.to_dict()["auc"] == 0.72
    assert rule.Calibration.from_dict(json.loads(json.dumps(with_auc.to_dict()))) == with_auc
    with pytest.raises(ValueError, match="Calibration.auc"):
        rule.Calibration.from_dict({**good, "auc": 1.5})
    assert rule.Calibration.from_dict(json.loads(json.dumps(cal.to_dict()))) == cal
    assert rule.Calibration.from_dict(TINY.to_dict()).table == TINY.table
    full = rule.Calibration.from_dict({**good, "pos": [0] * 128, "neg": [0] * 128,
                                       "bins": rule.BINS})
    no_bins = {k: v for k, v in full.to_dict().items() if k != "bins"}
    assert rule.Calibration.from_dict(no_bins) == full                 # bins defaults to B


def test_rho_is_absorbed_by_delta():
    """With δ solved so that E[p] = κ, ρ shifts every p by λρ and δ takes it back: the
    survival probabilities are the same for any ρ (the clip included)."""
    import numpy as np

    from vllm_rl.arrol.calibration import solve_delta

    q = np.random.default_rng(0).uniform(0, 1, 500)
    ps = []
    for rho in (0.2, 0.5, 0.8):
        d = solve_delta(q, 0.5, rho, 0.5, 0.1, 0.9)
        ps.append([rule.survival(v, d, 0.5, rho, 0.5, 0.1, 0.9) for v in q])
    assert np.allclose(ps[0], ps[1], atol=1e-7) and np.allclose(ps[1], ps[2], atol=1e-7)
