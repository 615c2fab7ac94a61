"""DAS length-aware draft budget (vllm_rl.das.budget_model): pure Python, no engine."""
from __future__ import annotations

import math
import random
import re
import subprocess
import sys

import pytest

from vllm_rl.das.length_classes import CLASSES, LONG, MEDIUM, SHORT, LengthClasses
from vllm_rl.das.budget_model import (
    AcceptanceEstimate,
    accepted_tokens,
    chain_acceptance,
    estimate_k_alpha,
    fit_alpha,
    latency,
    optimal_budget,
    optimal_budgets,
    remaining_passes,
    step_budget,
)
from vllm_rl.das.batch_caps import batch_cap, break_even_batch


def test_no_vllm_import():
    code = "import sys, vllm_rl.das.budget_model; assert 'vllm' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


# ---------------------------------------------------------------- Sec. 4.2.3: thresholds


def test_thresholds_cold_start_and_moving_average():
    lc = LengthClasses(horizon=3)
    assert lc.t_short(1000) == 500.0                   # cold start: max_tokens / 2
    assert lc.t_med(1000) == 750.0
    lc.observe_round(100)
    assert lc.t_short(1000) == 100.0
    lc.observe_round(200)
    assert lc.t_short(1000) == 150.0
    lc.observe_round(300)
    assert lc.t_short(1000) == 200.0
    lc.observe_round(700)                              # 100 drops out: (200+300+700)/3
    assert lc.t_short(1000) == 400.0
    assert lc.t_med(1000) == 700.0                     # (400 + 1000) / 2
    assert lc.t_short(256) == 256.0                    # clamped to max_tokens
    assert lc.t_med(256) == 256.0
    lc2 = LengthClasses()
    lc2.observe_round(0)
    assert lc2.t_short(64) == 1.0                      # clamped to >= 1


def test_classify():
    lc = LengthClasses()
    lc.observe_round(400)                              # T_short 400, T_med 700 at 1000
    assert lc.classify(0, 1000) == SHORT
    assert lc.classify(399, 1000) == SHORT
    assert lc.classify(400, 1000) == MEDIUM
    assert lc.classify(699, 1000) == MEDIUM
    assert lc.classify(700, 1000) == LONG
    assert lc.classify(5000, 1000) == LONG
    lc.observe_round(800)                              # T_short 600, T_med 800
    assert lc.classify(500, 1000) == SHORT
    assert lc.budget(SHORT, 4) == 0
    assert lc.budget(MEDIUM, 4) == 4
    assert lc.budget(LONG, 4) == 8


def test_bad_arguments():
    lc = LengthClasses()
    with pytest.raises(ValueError):
        lc.classify(-1, 100)
    with pytest.raises(ValueError):
        lc.classify(10, 0)
    with pytest.raises(ValueError):
        lc.observe_final("huge", 10, 100)
    with pytest.raises(ValueError):
        lc.posterior("huge", 10, SHORT, 100)
    with pytest.raises(ValueError):
        LengthClasses(horizon=0)
    with pytest.raises(ValueError):
        LengthClasses(promote_short=1.5)


def test_initial_ties_and_empty():
    lc = LengthClasses()
    lc.observe_round(400)                              # short < 400 <= medium < 700 <= long
    assert lc.initial([], 1000) == MEDIUM
    assert lc.initial([10, 20, 500], 1000) == SHORT
    assert lc.initial([10, 500, 800, 900], 1000) == LONG
    assert lc.initial([10, 500], 1000) == MEDIUM       # short/medium tie -> medium
    assert lc.initial([10, 900], 1000) == LONG         # short/long tie -> long
    assert lc.initial([10, 500, 900], 1000) == LONG    # three-way tie -> long
    assert lc.initial([10], 1000) == SHORT
    # Thresholds move: the same lengths are re-classified at query time.
    for _ in range(16):
        lc.observe_round(5)
    assert lc.initial([10, 20, 500], 1000) == MEDIUM   # T_short 5, T_med 502.5


# ----------------------------------------------------------------- Sec. 4.2.3: posterior


def _brute_posterior(lc: LengthClasses, entries, cls, length, init, max_tokens):
    entries = entries[-lc.history:]
    group = [(L, M) for i, L, M in entries if i == init and L >= length]
    if len(group) < lc.min_support:
        group = [(L, M) for _, L, M in entries if L >= length]
    if not group:
        return 1.0 if lc.classify(length, max_tokens) == cls else 0.0
    return sum(lc.classify(L, M) == cls for L, M in group) / len(group)


def test_posterior_matches_brute_force():
    rng = random.Random(1)
    cases = 0
    for _ in range(60):
        lc = LengthClasses(horizon=rng.randint(1, 4), history=rng.choice([5, 40, 4096]),
                           min_support=rng.randint(1, 10))
        maxes = rng.choice([[100], [100, 256], [64, 100, 256]])
        entries = []
        for step in range(rng.randint(0, 120)):
            if rng.random() < 0.1:
                lc.observe_round(rng.randint(0, 300))
            M = rng.choice(maxes)
            entry = (rng.choice(CLASSES), rng.randint(0, M), M)
            lc.observe_final(*entry)
            entries.append(entry)
            if step % 7 == 0 or rng.random() < 0.05:
                for _ in range(3):
                    length = rng.randint(0, 300)
                    init = rng.choice(CLASSES)
                    M = rng.choice(maxes)
                    got = lc.posteriors(length, init, M)
                    assert sum(got) == pytest.approx(1.0)
                    for cls in CLASSES:
                        want = _brute_posterior(lc, entries, cls, length, init, M)
                        assert lc.posterior(cls, length, init, M) == want
                        assert got[CLASSES.index(cls)] == want
                        cases += 1
        assert len(lc) == min(len(entries), lc.history)
    assert cases >= 500


def test_posterior_by_hand():
    lc = LengthClasses(min_support=2)
    lc.observe_round(40)                               # at 100: short < 40 <= medium < 70
    for L in (10, 20, 50, 80):
        lc.observe_final(SHORT, L, 100)
    for L in (60, 90, 95):
        lc.observe_final(LONG, L, 100)
    # init SHORT, l = 15: entries >= 15 are 20, 50, 80 -> 1/3 each.
    assert lc.posteriors(15, SHORT, 100) == (1 / 3, 1 / 3, 1 / 3)
    # init SHORT, l = 60: only 80 (support 1 < 2) -> pooled: 60, 80, 90, 95.
    assert lc.posteriors(60, SHORT, 100) == (0.0, 0.25, 0.75)
    # init MEDIUM: no entries -> pooled.
    assert lc.posteriors(15, MEDIUM, 100) == (1 / 6, 2 / 6, 3 / 6)
    # Longer than anything seen: the class of l itself.
    assert lc.posteriors(99, LONG, 100) == (0.0, 0.0, 1.0)
    # init LONG, l = 50: 60, 90, 95 (support 3 >= 2).
    assert lc.posteriors(50, LONG, 100) == (0.0, 1 / 3, 2 / 3)


# ------------------------------------------------------------------ Sec. 4.2.3: update


def test_update_promotes_and_never_demotes():
    lc = LengthClasses(min_support=1)
    lc.observe_round(40)                               # at 100: short < 40 <= medium < 70
    for L in (10, 12, 14, 16, 18, 30, 45, 50, 80, 85, 90):
        lc.observe_final(SHORT, L, 100)
    # l = 5: all 11 qualify, 6 short -> P(short) = 6/11 >= 0.4: stays short.
    assert lc.update(SHORT, 5, SHORT, 100) == SHORT
    # l = 17: 18, 30 short, 45, 50 medium, 80, 85, 90 long: P(short) = 2/7 < 0.4 ->
    # medium; P(long) = 3/7 <= 0.6 -> stays medium.
    assert lc.update(SHORT, 17, SHORT, 100) == MEDIUM
    # l = 46: 50 medium, 80, 85, 90 long: P(short) = 0 -> medium, P(long) = 3/4 -> long:
    # short to long in one call.
    assert lc.update(SHORT, 46, SHORT, 100) == LONG
    assert lc.update(MEDIUM, 46, SHORT, 100) == LONG
    # Never demote: a long request stays long even where P(long) = 0.
    assert lc.update(LONG, 0, SHORT, 100) == LONG
    assert lc.posterior(LONG, 0, SHORT, 100) < 0.6
    assert lc.update(MEDIUM, 0, SHORT, 100) == MEDIUM
    # Longer than all history: the class of l itself decides.
    assert lc.update(SHORT, 95, SHORT, 100) == LONG    # 95 >= T_med = 70
    assert lc.update(SHORT, 60, MEDIUM, 100) == LONG   # pooled 80, 85, 90: P(long) = 1
    lc2 = LengthClasses()
    lc2.observe_round(40)
    assert lc2.update(SHORT, 30, MEDIUM, 100) == SHORT  # empty history, 30 is short
    assert lc2.update(SHORT, 50, MEDIUM, 100) == MEDIUM
    assert lc2.update(SHORT, 70, MEDIUM, 100) == LONG


def test_update_is_monotone_along_a_generation():
    rng = random.Random(2)
    lc = LengthClasses()
    lc.observe_round(300)
    for _ in range(2000):
        lc.observe_final(rng.choice(CLASSES), min(1000, int(rng.expovariate(1 / 300))), 1000)
    for init in CLASSES:
        cls = init
        for length in range(0, 1001, 5):
            new = lc.update(cls, length, init, 1000)
            assert CLASSES.index(new) >= CLASSES.index(cls)
            cls = new
        assert cls == LONG


def test_posterior_reads_sorted_lists_not_the_history(monkeypatch):
    """O(log n) per query: the posterior bisects per-max_tokens sorted lists and never
    walks the history deque (counted, not timed)."""
    import vllm_rl.das.length_classes as das

    rng = random.Random(3)
    lc = LengthClasses()
    lc.observe_round(3000)
    for _ in range(4096):
        lc.observe_final(rng.choice(CLASSES), rng.randint(0, 8192), 8192)
    calls = []
    real = das.bisect_left
    monkeypatch.setattr(das, "bisect_left", lambda a, x: calls.append(1) or real(a, x))
    monkeypatch.setattr(lc, "_entries", None)           # any walk of history would fail
    for i in range(0, 5000, 50):
        lc.update(SHORT, i, MEDIUM, 8192)
    assert len(calls) <= 100 * 6                        # 3 bisections per list, <= 2 lists


# ------------------------------------------------------------- Sec. 4.2.2: Eq. 3, 4, 5


def test_eq3_eq4_eq5_by_hand():
    # k = 0.5, alpha = 1, l = 100, p = 100 ln 2: e^{-alpha p / l} = 1/2.
    p = 100 * math.log(2)
    assert accepted_tokens(p, 100, 0.5, 1.0) == pytest.approx(25.0)
    assert remaining_passes(p, 100, 0.5, 1.0) == pytest.approx(75.0)
    assert accepted_tokens(0, 100, 0.5, 1.0) == 0.0
    assert remaining_passes(0, 100, 0.5, 1.0) == 100.0
    assert accepted_tokens(1e9, 100, 0.8, 1.0) == pytest.approx(80.0)   # capacity k l
    assert accepted_tokens(5, 0, 0.8, 1.0) == 0.0
    # J = c_base max(75, 50) + c_tok (p + 0) + C
    assert latency([p, 0], [100, 50], [0.5, 0.9], [1.0, 2.0], 2.0, 0.5, 3.0) == \
        pytest.approx(2 * 75 + 0.5 * p + 3)
    assert latency([p, 0], [100, 200], [0.5, 0.9], [1.0, 2.0], 2.0, 0.5) == \
        pytest.approx(2 * 200 + 0.5 * p)
    assert latency([], [], [], [], 1.0, 1.0, 7.0) == 7.0


def test_eq7_by_hand():
    # l = 100, k = 0.5, alpha = 1, N = 75: 1 - (1 - 0.75)/0.5 = 1/2 -> p* = 100 ln 2.
    assert optimal_budget(100, 0.5, 1.0, 75) == pytest.approx(100 * math.log(2))
    assert optimal_budget(100, 0.5, 1.0, 100) == 0.0
    assert optimal_budget(100, 0.5, 1.0, 150) == 0.0
    assert optimal_budget(100, 0.5, 1.0, 50) == math.inf
    assert optimal_budget(100, 0.5, 1.0, 40, p_max=64) == 64.0
    assert optimal_budget(100, 0.5, 1.0, 75, p_max=64) == 64.0
    assert optimal_budget(100, 0.5, 1.0, 75, p_max=1000) == pytest.approx(100 * math.log(2))
    assert optimal_budget(100, 0.0, 1.0, 99) == math.inf
    assert optimal_budget(0, 0.5, 1.0, 0) == 0.0


def test_eq7_makes_the_constraint_tight():
    rng = random.Random(4)
    for _ in range(500):
        l = rng.uniform(1, 8000)
        k = rng.uniform(0.01, 1.0)
        alpha = rng.uniform(0.05, 10)
        n_fwd = rng.uniform(l * (1 - k), l) * (1 - 1e-9) + 1e-9 * l
        p = optimal_budget(l, k, alpha, n_fwd)
        assert p >= 0
        assert remaining_passes(p, l, k, alpha) == pytest.approx(n_fwd, rel=1e-9)
        assert accepted_tokens(p, l, k, alpha) == pytest.approx(l - n_fwd, rel=1e-6, abs=1e-6)


# --------------------------------------------------------------------- Eq. 6 solved


def _j(N, ls, ks, alphas, c_base, c_tok):
    """J(N) = c_base N + c_tok Σ p_i(N), brute force (inf outside the feasible range)."""
    total = 0.0
    for l, k, a in zip(ls, ks, alphas):
        if N >= l or l == 0:
            continue
        x = (1 - N / l) / k if k > 0 else math.inf
        if x >= 1:
            return math.inf
        total += -(l / a) * math.log(1 - x)
    return c_base * N + c_tok * total


def _j_capped(N, ls, ks, alphas, c_base, c_tok, p_max):
    for l, k, a in zip(ls, ks, alphas):
        if l > 0 and l * (1 - k + k * math.exp(-a * p_max / l)) > N * (1 + 1e-12):
            return math.inf
    return _j(N, ls, ks, alphas, c_base, c_tok)


def _grid_min(f, lo, hi, points=1001, rounds=3):
    best_n, best = hi, f(hi)
    for _ in range(rounds):
        step = (hi - lo) / (points - 1)
        for i in range(points):
            N = lo + i * step
            value = f(N)
            if value < best:
                best_n, best = N, value
        lo, hi = max(lo, best_n - 2 * step), min(hi, best_n + 2 * step)
    return best


def _instance(rng):
    n = rng.randint(1, 8)
    ls = [rng.choice([rng.uniform(1, 4000), float(rng.randint(0, 4000))]) for _ in range(n)]
    ks = [rng.choice([0.0, 1.0, rng.uniform(0.05, 0.95)]) if rng.random() < 0.15
          else rng.uniform(0.05, 0.95) for _ in range(n)]
    alphas = [rng.uniform(0.2, 5.0) for _ in range(n)]
    return ls, ks, alphas, rng.uniform(0.5, 50.0), rng.uniform(0.01, 2.0)


def test_optimal_budgets_against_grid_search():
    rng = random.Random(5)
    for _ in range(150):
        ls, ks, alphas, c_base, c_tok = _instance(rng)
        n_fwd, ps = optimal_budgets(ls, ks, alphas, c_base, c_tok)
        top = max(ls)
        assert 0 <= n_fwd <= top
        got = _j(n_fwd, ls, ks, alphas, c_base, c_tok)
        # The returned p* are Eq. 7 at N* and realise it in Eq. 5.
        assert got == pytest.approx(c_base * n_fwd + c_tok * math.fsum(ps), rel=1e-9)
        assert latency(ps, ls, ks, alphas, c_base, c_tok) == pytest.approx(got, rel=1e-9)
        for l, k, a, p in zip(ls, ks, alphas, ps):
            if p > 0:
                assert remaining_passes(p, l, k, a) == pytest.approx(n_fwd, rel=1e-9)
            else:
                assert l <= n_fwd or k == 0 or l == 0
        floor = max([l * (1 - k) for l, k in zip(ls, ks) if k > 0] + [0.0])
        floor = max([floor] + [l for l, k in zip(ls, ks) if k == 0])
        lo = floor + 1e-9 * max(top, 1.0)
        best = _grid_min(lambda N: _j(N, ls, ks, alphas, c_base, c_tok), min(lo, top), top)
        assert got <= best * (1 + 1e-12)                # never worse than the grid
        assert got == pytest.approx(best, rel=1e-6)


def test_optimal_budgets_with_cap_against_grid_search():
    rng = random.Random(6)
    for _ in range(150):
        ls, ks, alphas, c_base, c_tok = _instance(rng)
        p_max = rng.choice([0.0, rng.uniform(1, 50), rng.uniform(50, 5000)])
        n_fwd, ps = optimal_budgets(ls, ks, alphas, c_base, c_tok, p_max=p_max)
        assert all(0 <= p <= p_max for p in ps)
        f = lambda N: _j_capped(N, ls, ks, alphas, c_base, c_tok, p_max)  # noqa: E731
        got = f(n_fwd)
        assert math.isfinite(got)
        assert latency(ps, ls, ks, alphas, c_base, c_tok) == pytest.approx(got, rel=1e-9)
        top = max(ls)
        lo = max(l * (1 - k + k * math.exp(-a * p_max / l)) if l > 0 else 0.0
                 for l, k, a in zip(ls, ks, alphas))
        best = _grid_min(f, lo, top)
        assert got <= best * (1 + 1e-12)
        assert got == pytest.approx(best, rel=1e-6)


def test_optimal_budgets_edge_cases():
    assert optimal_budgets([], [], [], 1.0, 1.0) == (0.0, [])
    # No gain anywhere (k = 0): N = max l, nobody drafts.
    assert optimal_budgets([100, 50], [0.0, 0.0], [1, 1], 10, 0.1) == (100.0, [0.0, 0.0])
    # The longest request cannot draft: N = its length, the others gain nothing either.
    assert optimal_budgets([100, 80], [0.0, 0.9], [1, 1], 10, 0.1) == (100.0, [0.0, 0.0])
    # All finished.
    assert optimal_budgets([0, 0], [0.5, 0.5], [1, 1], 10, 0.1) == (0.0, [0.0, 0.0])
    # Drafting never pays (c_tok > c_base α k): nobody drafts.
    assert optimal_budgets([100, 90], [0.5, 0.5], [1, 1], 1.0, 10.0) == (100.0, [0.0, 0.0])
    # p_max = 0: no drafting.
    assert optimal_budgets([100, 90], [0.5, 0.5], [1, 1], 10.0, 0.1, p_max=0) == \
        (100.0, [0.0, 0.0])
    # One request, closed form: dJ/dN = c_base - c_tok / (α (k - 1 + N/l)) = 0.
    l, k, a, cb, ct = 1000.0, 0.8, 1.5, 10.0, 1.0
    n_fwd, (p,) = optimal_budgets([l], [k], [a], cb, ct)
    assert n_fwd == pytest.approx(l * (ct / (a * cb) + 1 - k), rel=1e-10)
    assert p == pytest.approx(optimal_budget(l, k, a, n_fwd), rel=1e-12)
    # Short requests (l <= N*) skip speculation (Sec. 4.2.2, observation 2).
    n_fwd, ps = optimal_budgets([1000, 900, 100, 50], [0.8] * 4, [1.5] * 4, 10.0, 1.0)
    assert ps[2] == ps[3] == 0.0 and ps[0] > ps[1] > 0
    with pytest.raises(ValueError):
        optimal_budgets([1, 2], [0.5], [1, 1], 1.0, 1.0)
    with pytest.raises(ValueError):
        optimal_budgets([1], [0.5], [1], 1.0, 0.0)


def test_step_budget():
    assert step_budget(0, 100, 8) == 0
    assert step_budget(250, 100, 8) == 3               # 2.5 rounds half up
    assert step_budget(240, 100, 8) == 2
    assert step_budget(2000, 100, 8) == 8              # capped
    assert step_budget(math.inf, 100, 8) == 8
    assert step_budget(10, 0, 8) == 8
    assert step_budget(40, 100, 8) == 0
    assert step_budget(250, 100, 0) == 0
    with pytest.raises(ValueError):
        step_budget(-1, 100, 8)


# ------------------------------------------------------------- fitting (k, α) to counts


def _chain_counts(q, gamma, rounds):
    """Expected counts of ``rounds`` verification steps with budget ``gamma`` under a
    geometric acceptance chain: S = q (1 - q^γ) / (1 - q) accepted per step."""
    s = q * (1 - q ** gamma) / (1 - q)
    return gamma * rounds, s * rounds, (s + 1) * rounds


def test_estimate_k_alpha_recovers_the_chain():
    for q in (0.1, 0.3, 0.5, 0.7, 0.9):
        for gamma in (1, 2, 4, 8, 16):
            P, A, l = _chain_counts(q, gamma, 10 ** 6)
            assert chain_acceptance(P, A, l) == pytest.approx(q, rel=1e-9)
            est = AcceptanceEstimate(round(P), round(A), round(l))
            k, alpha = estimate_k_alpha(est, prior_weight=0.0)
            assert k == pytest.approx(q, rel=1e-4)
            # α fits Eq. 3 through the counts (A < k l always holds for a chain).
            assert 0.05 < alpha < 20
            assert accepted_tokens(est.proposed, est.generated, k, alpha) == \
                pytest.approx(est.accepted, rel=1e-6)


def test_estimate_k_alpha_recovers_eq3():
    """Counts generated by Eq. 3 with a known (k, α): given k, α is recovered exactly;
    with one draft per step the estimate of k is accepted / proposed (brief's formula)."""
    rng = random.Random(7)
    for _ in range(200):
        k, alpha = rng.uniform(0.05, 0.95), rng.uniform(0.1, 10)
        l = rng.uniform(100, 1e6)
        P = rng.uniform(0.01, 10) * l / alpha          # αP/l <= 10: A/(k l) not yet 1
        A = accepted_tokens(P, l, k, alpha)
        assert fit_alpha(P, A, l, k) == pytest.approx(alpha, rel=1e-9)
    # One draft per step: P = R = l - A, q = A / P.  Choose (k, α) consistent with that:
    # q = k, and Eq. 3 through (P, A, l) fixes α.
    for q in (0.2, 0.5, 0.8):
        P, A, l = _chain_counts(q, 1, 10 ** 6)
        est = AcceptanceEstimate(round(P), round(A), round(l))
        k, alpha = estimate_k_alpha(est, prior_k=0.5, prior_weight=16.0)
        assert k == pytest.approx((est.accepted + 0.5 * 16) / (est.proposed + 16), rel=1e-9)
        assert k == pytest.approx(q, rel=1e-4)
        assert alpha == pytest.approx(fit_alpha(est.proposed, est.accepted,
                                                est.generated, k), rel=1e-12)
        # Round trip: Eq. 3 with the estimate reproduces the counts.
        assert accepted_tokens(est.proposed, est.generated, k, alpha) == \
            pytest.approx(est.accepted, rel=1e-9)


def test_estimate_k_alpha_on_a_simulated_chain():
    rng = random.Random(8)
    for q, gamma in ((0.6, 4), (0.85, 8), (0.3, 2)):
        est = AcceptanceEstimate()
        for _ in range(20000):
            a = 0
            while a < gamma and rng.random() < q:
                a += 1
            est.observe(gamma, a, a + 1)
        k, alpha = estimate_k_alpha(est)
        assert k == pytest.approx(q, abs=0.01)
        assert 0.05 <= alpha <= 20


def test_estimate_k_alpha_prior_and_clamps():
    assert estimate_k_alpha(AcceptanceEstimate()) == (0.5, 1.0)
    assert estimate_k_alpha(AcceptanceEstimate(), prior_k=0.3, prior_alpha=2.0) == (0.3, 2.0)
    assert estimate_k_alpha(AcceptanceEstimate(), prior_k=1.0, prior_alpha=100.0) == (0.99, 20.0)
    # Nothing accepted: k shrinks towards 0 and clamps, α falls back to the prior.
    k, alpha = estimate_k_alpha(AcceptanceEstimate(10 ** 6, 0, 10 ** 6))
    assert k == 0.01 and alpha == 1.0
    # Everything accepted: q = 1, k clamps to 0.99.
    k, _ = estimate_k_alpha(AcceptanceEstimate(100, 100, 150), prior_weight=0.0)
    assert k == 0.99
    # A little data (16 steps of one draft, 12 accepted: q = 0.75): halfway between the
    # prior and the data for P = prior_weight.
    k, _ = estimate_k_alpha(AcceptanceEstimate(16, 12, 28), prior_k=0.5, prior_weight=16.0)
    assert k == pytest.approx(0.625)
    est = AcceptanceEstimate()
    est.observe(4, 3, 4)
    est.observe(4, 1, 2)
    assert (est.proposed, est.accepted, est.generated) == (8, 4, 6)
    with pytest.raises(ValueError):
        est.observe(2, 3, 4)
    assert chain_acceptance(0, 0, 5) is None
    assert fit_alpha(10, 0, 20, 0.5) is None
    assert fit_alpha(10, 15, 20, 0.5) is None          # A >= k l


# -------------------------------------------------------------- Eq. 1-2: batch size


def test_batch_cap():
    assert batch_cap(0, 8, 64) == 1.0
    assert batch_cap(8, 8, 64) == 1.0
    assert batch_cap(36, 8, 64) == 0.5
    assert batch_cap(50, 8, 64) == pytest.approx(14 / 56)
    assert batch_cap(64, 8, 64) == 0.0
    assert batch_cap(1000, 8, 64) == 0.0
    assert batch_cap(8, 8, 8) == 1.0
    assert batch_cap(9, 8, 8) == 0.0
    with pytest.raises(ValueError):
        batch_cap(4, 8, 4)


def test_break_even_batch():
    # c_base 10, c_tok 0.5, a = 2 of p = 4: B* = 10 * 2 / (0.5 * 2) = 20.
    assert break_even_batch(10, 0.5, 2, 4) == 20.0
    # At B*: (1 + a)(c_base + c_tok B) == c_base + c_tok B (1 + p).
    B = 20.0
    assert (1 + 2) * (10 + 0.5 * B) == 10 + 0.5 * B * (1 + 4)
    assert break_even_batch(10, 0.5, 4, 4) == math.inf
    assert break_even_batch(10, 0.5, 0, 4) == 0.0
    assert break_even_batch(10, 0.0, 2, 4) == math.inf
    rng = random.Random(9)
    for _ in range(100):
        cb, ct = rng.uniform(1, 50), rng.uniform(0.01, 2)
        p = rng.uniform(1, 16)
        a = rng.uniform(0.1, p * 0.99)
        b_star = break_even_batch(cb, ct, a, p)
        for b, pays in ((b_star * 0.9, True), (b_star * 1.1, False)):
            per_token_draft = (cb + ct * b * (1 + p)) / (1 + a)
            assert (per_token_draft < cb + ct * b) == pays


def test_cost_cap_drafts_where_widening_is_cheap():
    from vllm_rl.das.batch_caps import chain_accepted, cost_cap
    from vllm_rl.cost import load_cost

    assert chain_accepted(0.5, 3) == pytest.approx(0.875)
    assert chain_accepted(1.0, 4) == 4.0
    h100 = load_cost("h100:qwen3-8b")
    step = lambda b: (lambda k: h100.uniform_ms(b, 1 + k, 256))  # noqa: E731
    assert cost_cap(step(8), 8, 8, 0.6, 8) >= 4          # memory-bound: nearly free
    assert cost_cap(step(1024), 1024, 1024, 0.6, 8) == 0  # compute-bound: never pays
    caps = [cost_cap(step(b), b, b, 0.6, 8) for b in (1, 16, 64, 256, 1024)]
    assert caps == sorted(caps, reverse=True)
    assert cost_cap(lambda k: 1.0 + k, 4, 4, 0.0, 8) == 0   # nothing accepted: no drafts
    assert cost_cap(step(8), 8, 0, 0.9, 8) == 0


# ------------------------------------------------- phase-aware drafting on the cost model


def _h100_step(batch: int, context: float = 256):
    from vllm_rl.cost import load_cost

    h100 = load_cost("h100:qwen3-8b")
    curve = [h100.uniform_ms(batch, 1 + k, context) for k in range(9)]
    return curve.__getitem__


def test_the_h100_table_makes_drafting_a_tail_affair():
    """The table facts the phase-aware rule rests on: at L = 256, verifying 8 drafts costs
    5.3x a decode step at B = 256 and 1.15x at B = 16."""
    b256, b16 = _h100_step(256, 256), _h100_step(16, 256)
    assert b256(8) / b256(0) == pytest.approx(5.26, abs=0.01)
    assert b16(8) / b16(0) == pytest.approx(1.15, abs=0.01)


def test_phase_budgets_against_brute_force():
    """Eq. 1-3 on a step-cost curve: the split the rule returns has the smallest expected
    time per generated token of every split within the caps (and no more drafts than the
    smallest such split)."""
    from itertools import product

    from vllm_rl.das.batch_caps import chain_accepted, phase_budgets, phase_ms_per_token

    rng = random.Random(7)
    for _ in range(1500):
        n = rng.randint(1, 4)
        batch = n + rng.randint(0, 3)
        caps = [rng.randint(0, 3) for _ in range(n)]
        q = [rng.choice([0.0, 0.3, 0.5, 0.5, 0.9, 1.0, rng.random()]) for _ in range(n)]
        base = rng.uniform(1.0, 10.0)
        rises = sorted(rng.choice([0.0, rng.uniform(0.0, 20.0)]) for _ in range(max(caps)))
        curve = [base] + [base + r for r in rises]
        top = max(caps)

        def ratio(ks):        # the curve read at Σk / batch, linear between integer widths
            x = sum(ks) / batch
            k = min(int(x), top - 1) if top else 0
            ms = curve[k] + (x - k) * (curve[k + 1] - curve[k]) if top else curve[0]
            return ms / (batch + sum(chain_accepted(a, b) for a, b in zip(q, ks)))

        got = phase_budgets(curve.__getitem__, batch, q, caps)
        assert all(0 <= k <= c for k, c in zip(got, caps))
        best = min(ratio(ks) for ks in product(*[range(c + 1) for c in caps]))
        assert ratio(got) == pytest.approx(best, rel=1e-9)
        fewest = min(sum(ks) for ks in product(*[range(c + 1) for c in caps])
                     if ratio(ks) <= best * (1 + 1e-9))
        assert sum(got) == fewest
        if top and sum(got) and max(got) == top:
            assert phase_ms_per_token(curve.__getitem__, batch, q, got) == \
                pytest.approx(ratio(got), rel=1e-12)


def test_phase_budgets_off_in_the_bulk_full_in_the_tail():
    """On the H100 table: at q = 0.5 a batch of 1024 drafts nothing, 256 at most one token
    per request, and a tail of 16 or fewer drafts most of the 2b = 8 budget; at q = 0.8
    the tail drafts the full budget.  Drafts per request never grow with the batch."""
    from vllm_rl.das.batch_caps import phase_budgets

    def per_row(batch, q):
        return sum(phase_budgets(_h100_step(batch), batch, [q] * batch, [8] * batch)) / batch

    assert per_row(1024, 0.5) == 0
    assert per_row(256, 0.5) <= 1
    assert all(per_row(b, 0.5) >= 5 for b in (1, 4, 16))
    assert all(per_row(b, 0.8) == 8 for b in (1, 4, 16))
    for q in (0.3, 0.5, 0.7, 0.9):
        rows = [per_row(b, q) for b in (1, 4, 16, 32, 64, 128, 256, 512, 1024)]
        assert rows == sorted(rows, reverse=True)


def test_phase_budgets_draft_where_acceptance_is_high():
    """In a mixed bulk step the drafts go to the requests whose drafts get accepted: the
    length is non-decreasing in q; near-certain drafts still pay at B = 256."""
    from vllm_rl.das.batch_caps import phase_budgets

    q = [0.2, 0.5, 0.8, 0.95] * 64
    ks = phase_budgets(_h100_step(256), 256, q, [8] * 256)
    by_q = {v: {k for k, w in zip(ks, q) if w == v} for v in set(q)}
    assert all(len(s) <= 2 for s in by_q.values())      # equal rows differ by <= 1
    levels = [max(by_q[v]) for v in sorted(by_q)]
    assert levels == sorted(levels) and levels[0] == 0 and levels[-1] >= 2


def test_phase_budgets_caps_and_edges():
    from vllm_rl.das.batch_caps import phase_budgets

    step = _h100_step(4)
    assert phase_budgets(step, 4, [0.9, 0.9, 0.0, 0.9], [8, 3, 8, 0]) == [8, 3, 0, 0]
    assert phase_budgets(step, 4, [], []) == []
    assert phase_budgets(step, 0, [], []) == []
    assert phase_budgets(lambda k: 5.0, 2, [0.1, 0.1], [8, 8]) == [8, 8]   # free width
    assert phase_budgets(lambda k: 5.0 * (1 + k), 2, [0.99, 0.99], [8, 8]) == [0, 0]
    # One drafting row in a step of 1024: a draft token costs ~2/3 of the step's mean
    # token there (compute-bound), so only drafts accepted more often than that pay.
    assert phase_budgets(_h100_step(1024), 1024, [0.6], [8]) == [0]
    assert 0 < phase_budgets(_h100_step(1024), 1024, [0.9], [8])[0] < 8


def test_phase_budgets_bad_arguments():
    from vllm_rl.das.batch_caps import phase_budgets, phase_ms_per_token

    step = _h100_step(4)
    for args, name in (((step, 4, [0.5], [8, 8]), "caps"),
                       ((step, 4, [1.5], [8]), "q[0]"),
                       ((step, 4, [0.5], [-1]), "caps[0]"),
                       ((step, 4, [0.5], [2.0]), "caps[0]"),
                       ((step, 1, [0.5, 0.5], [1, 1]), "more than the batch"),
                       ((lambda k: -1.0, 4, [0.5], [1]), "step_ms(0)"),
                       ((step, -1, [], []), "batch")):
        with pytest.raises(ValueError, match=re.escape(name)):
            phase_budgets(*args)
    with pytest.raises(ValueError, match="k"):
        phase_ms_per_token(step, 4, [0.5], [1, 2])


def test_few_names_the_requests_of_a_small_share_of_rows():
    """The drafter names the requests it drafts for when they are at most half the live
    rows (the scheduler gives only those placeholders); else None, every DAS sample."""
    import numpy as np

    from vllm_rl.das.draft_lengths import _few

    ids = ["a", "b", "c", "d"]
    assert _few(ids, np.array([False, True, False, False]), 4) == frozenset({"b"})
    assert _few(ids, np.array([True, True, False, False]), 4) == frozenset({"a", "b"})
    assert _few(ids, np.array([True, True, True, False]), 4) is None
    assert _few(ids, np.zeros(4, dtype=bool), 4) is None
