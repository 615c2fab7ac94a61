"""ARRoL's pruning rule (App. A.4 Eq. 1, Bayes, Eq. 2; Alg. 1 l.17-21), by hand."""
from __future__ import annotations

import math
import random
from types import SimpleNamespace

import pytest

from vllm_rl.engine.policies import arrol as rule
from vllm_rl.engine.policies.duet import seeded_coin

FLAGS = SimpleNamespace(kappa=0.5, rho=0.5, lam=0.5, p_min=0.1, p_max=0.9)


def test_bins():
    assert rule.bin_of(0.0) == 0 and rule.bin_of(1.0) == rule.BINS - 1
    assert rule.bin_of(0.5, 4) == 2 and rule.bin_of(0.25, 4) == 1 and rule.bin_of(0.2499, 4) == 0
    assert rule.bin_of(-3.0, 4) == 0 and rule.bin_of(7.0, 4) == 3


def test_posterior_by_hand():
    # B = 4, alpha = 1: P(b|1) = (c+ + 1) / (6 + 4), P(b|0) = (c- + 1) / (6 + 4)
    cal = rule.Calibration(pos=(0, 1, 2, 3), neg=(3, 2, 1, 0), alpha=1.0, prior=0.25,
                           delta=0.0, bins=4)
    for b, (cp, cn) in enumerate(zip((0, 1, 2, 3), (3, 2, 1, 0))):
        l1, l0 = (cp + 1) / 10, (cn + 1) / 10
        q = 0.25 * l1 / (0.25 * l1 + 0.75 * l0)
        assert rule.posterior(cal, (b + 0.5) / 4) == pytest.approx(q)
    assert rule.posterior(cal, 0.9) == pytest.approx(0.25 * 0.4 / (0.25 * 0.4 + 0.75 * 0.1))


def test_survival_is_eq2_clipped():
    assert rule.survival(0.5, 0.0, 0.5, 0.5, 0.5, 0.1, 0.9) == pytest.approx(0.5)
    assert rule.survival(0.1, 0.05, 0.5, 0.5, 0.5, 0.1, 0.9) == pytest.approx(0.75)
    assert rule.survival(0.0, 0.5, 0.5, 0.5, 0.5, 0.1, 0.9) == 0.9
    assert rule.survival(1.0, -0.5, 0.5, 0.5, 0.5, 0.1, 0.9) == 0.1


def test_decide_cold_start_and_coin():
    v = rule.decide(0.7, None, FLAGS, coin=0.999)
    assert (v.q, v.p, v.pruned) == (None, None, False)
    cal = rule.Calibration((0,) * 4, (0,) * 4, 1.0, 0.5, 0.0, 4)      # q = 0.5, p = 0.5
    assert rule.decide(0.7, cal, FLAGS, coin=0.4999).pruned is False
    assert rule.decide(0.7, cal, FLAGS, coin=0.5).pruned is True


def test_coin_is_seeded_and_its_own():
    a = rule.prune_coin(7, [1, 2, 3], "r1")
    assert a == rule.prune_coin(7, [1, 2, 3], "r2")                   # seeded: id unused
    assert a != rule.prune_coin(8, [1, 2, 3], "r1")
    assert a != rule.prune_coin(7, [1, 2, 4], "r1")
    assert a != seeded_coin(7, [1, 2, 3], "r1")                       # not DUET's coin
    assert rule.prune_coin(None, [1], "x") != rule.prune_coin(None, [1], "y")


def test_kept_share_is_binomial_in_p():
    """Many independent coins at a fixed calibration: the kept count is Binomial(N, p)."""
    cal = rule.Calibration((0,) * 8, (0,) * 8, 1.0, 0.5, 0.1, 8)      # p = 0.6 everywhere
    n = 4000
    kept = sum(not rule.decide(random.Random(i).random(), cal, FLAGS,
                               rule.prune_coin(i, [5, 6], "r")).pruned for i in range(n))
    pmf = [math.exp(math.lgamma(n + 1) - math.lgamma(j + 1) - math.lgamma(n - j + 1)
                    + j * math.log(0.6) + (n - j) * math.log(0.4)) for j in range(n + 1)]
    p_value = sum(x for x in pmf if x <= pmf[kept] * (1 + 1e-12))
    assert p_value > 1e-3, (kept, n)


def test_calibration_checks_name_the_field():
    good = dict(pos=[0] * 4, neg=[0] * 4, alpha=1.0, prior=0.5, delta=0.0, bins=4)
    for key, bad in (("alpha", 0.0), ("prior", 1.0), ("pos", [0] * 3), ("neg", [-1] * 4),
                     ("delta", float("nan")), ("bins", 0)):
        with pytest.raises(ValueError, match=key):
            rule.Calibration.from_dict({**good, key: bad})
    with pytest.raises(ValueError):
        rule.Calibration.from_dict({**good, "beta": 1})
    cal = rule.Calibration.from_dict(good)
    assert rule.Calibration.from_dict(cal.to_dict()) == cal
