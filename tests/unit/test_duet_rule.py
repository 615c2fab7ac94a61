"""DUET's online thresholds: natural-length quantiles from censored, reweighted ends."""
from __future__ import annotations

import random

import pytest

from vllm_rl.duet.rule import OnlineThresholds, km_quantile


def _lengths(n=20000, seed=0):
    r = random.Random(seed)
    return [int(r.expovariate(1 / 60)) + 1 for _ in range(n)]


def _q(xs, q):
    return sorted(xs)[int(q * len(xs))]


def test_km_without_censoring_is_the_empirical_quantile():
    xs = _lengths()
    obs = [(x, True, 1.0) for x in xs]
    for q in (0.3, 0.8):
        assert abs(km_quantile(obs, q) - _q(xs, q)) <= 1


def test_censoring_at_a_fixed_cut_leaves_lower_quantiles_exact():
    """A gate or max_tokens cuts every sample longer than c at c (right-censored)."""
    xs = _lengths()
    obs = [(min(x, 120), x <= 120, 1.0) for x in xs]
    assert abs(km_quantile(obs, 0.8) - _q(xs, 0.8)) <= 1
    assert km_quantile(obs, 0.95) == 120          # beyond every event: the largest seen


def test_eps_kept_samples_stand_for_the_aborted():
    """The gate aborts past c with probability 1 - eps (those leave) and keeps the rest
    to their natural end with weight 1/eps: the estimate reaches past the gate."""
    xs, r = _lengths(), random.Random(1)
    obs = []
    for x in xs:
        if x <= 100:
            obs.append((x, True, 1.0))
        elif r.random() < 0.1:
            obs.append((x, True, 10.0))
    true = _q(xs, 0.95)
    assert abs(km_quantile(obs, 0.95) - true) <= 0.05 * true


def test_refits_do_not_ratchet_down():
    """Refit every round from what a gate at K2 + G lets through: the censored estimate
    stays at the natural p80; taking only the samples that ended (the old window) falls
    round after round."""
    xs, r = _lengths(), random.Random(2)
    ours, naive = OnlineThresholds(refit_every=1), OnlineThresholds(refit_every=1)
    k2_ours, k2_naive = 120, 120
    for _ in range(8):
        for x in r.sample(xs, 1024):
            gate = k2_ours + 8
            ours.observe(min(x, gate), x <= gate)
            if x <= k2_naive + 8:
                naive.observe(x)
        ours.end_round()
        naive.end_round()
        k2_ours, k2_naive = ours.k2, naive.k2
    true = _q(xs, 0.8)
    assert abs(k2_ours - true) <= 0.08 * true
    assert k2_naive < 0.8 * true


def test_cold_start_until_the_first_refit():
    t = OnlineThresholds(refit_every=3)
    assert t.thresholds(200) == (60, 140)
    for _ in range(2):
        t.observe(50)
        t.end_round()
    assert t.thresholds(200) == (60, 140)
    t.end_round()
    assert t.thresholds(200) == (50, 50)
    with pytest.raises(ValueError):
        km_quantile([], 0.5)


@pytest.mark.parametrize("m, m_prime", [(7, 8), (4, 8), (8, 12)])
def test_darts_stops_make_the_pooled_estimate_err_long(m, m_prime):
    """A DARTS stop censors within a prompt (at the M-th shortest of its siblings), so
    the pooled estimate errs long, never short: with prompts of 10x different mean
    length the p80 lands 10-45% above the natural one (the bias the docstring of
    OnlineThresholds states); the p30, below the stops, stays close."""
    r = random.Random(m * 100 + m_prime)
    obs, natural = [], []
    for g in range(600):
        xs = [int(r.expovariate(1 / (20 if g % 2 else 200))) + 1 for _ in range(m_prime)]
        natural += xs
        cut = sorted(xs)[m - 1]
        obs += [(x, True, 1.0) if x <= cut else (cut, False, 1.0) for x in xs]
    p80, p30 = _q(natural, 0.8), _q(natural, 0.3)
    assert 1.05 * p80 <= km_quantile(obs, 0.8) <= 1.5 * p80
    assert p30 <= km_quantile(obs, 0.3) <= 1.5 * p30
