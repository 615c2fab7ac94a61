"""DARTS trainer side (vllm_rl.darts.controller, .budget): pure Python, no engine."""
from __future__ import annotations

import itertools
import json
import math
import random
import subprocess
import sys

import pytest

from vllm_rl.darts import (
    LengthStats,
    PromptPlan,
    adaptive_budget,
    allocate,
    allocation_objective,
    cost_line,
    cost_slope,
    ema,
    lambda_for_budget,
    length_quantiles,
    marginal_gain,
    minmax_norm,
    optimal_budget,
    plan,
    rollout_cost,
    sampling_mode,
)
from vllm_rl.flags import KEY, normalize, parse


def test_no_vllm_import():
    code = "import sys, vllm_rl.darts.controller, vllm_rl.darts.rollout_budget; assert 'vllm' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


# ------------------------------------------------------------------ LengthStats / EMA


def test_ema_step_and_seed():
    assert ema(None, 7.0, 0.9) == 7.0
    assert ema(10.0, 0.0, 0.9) == pytest.approx(9.0)
    assert ema(10.0, 20.0, 0.5) == pytest.approx(15.0)


def test_length_stats_hand_computed():
    stats = LengthStats(prompt_decay=0.5, dataset_decay=0.9)
    stats.update("a", [1, 3])          # pvariance 1
    stats.update("b", [2, 2, 2])       # pvariance 0
    stats.end_step()                   # pooled [1,3,2,2,2]: mean 2, pvar 0.4
    assert stats.variance("a") == pytest.approx(1.0)
    assert stats.std("b") == 0.0
    assert stats.mean == pytest.approx(2.0)
    assert stats.dataset_std == pytest.approx(math.sqrt(0.4))

    stats.update("a", [0, 6])          # pvariance 9 -> 0.5*1 + 0.5*9 = 5
    stats.end_step()                   # pooled [0,6]: mean 3, std 3
    assert stats.variance("a") == pytest.approx(5.0)
    assert stats.std("a") == pytest.approx(math.sqrt(5.0))
    assert stats.variance("b") == 0.0  # unchanged: not rolled out this step
    mean = 0.9 * 2.0 + 0.1 * 3.0
    std = 0.9 * math.sqrt(0.4) + 0.1 * 3.0
    assert stats.mean == pytest.approx(mean)
    assert stats.dataset_std == pytest.approx(std)
    assert stats.rho() == pytest.approx(std / mean)
    # Cold start: an unseen prompt gets the dataset-level std.
    assert "new" not in stats and stats.std("new") == pytest.approx(std)
    assert len(stats) == 2


def test_length_stats_empty_history():
    stats = LengthStats()
    assert stats.rho() == 0.0
    assert stats.std("anything") == 0.0
    stats.end_step()                   # nothing pending: no-op
    assert stats.mean == 0.0


def test_length_stats_pending_folded_on_read():
    explicit, lazy = LengthStats(), LengthStats()
    explicit.update_step({"p": [10, 30], "q": [20]})
    lazy.update("p", [10, 30])
    lazy.update("q", [20])
    assert lazy.rho() == pytest.approx(explicit.rho())
    assert explicit.mean == pytest.approx(20.0)


def test_length_stats_round_trip():
    stats = LengthStats(prompt_decay=0.3, dataset_decay=0.8)
    stats.update_step({"p": [10, 30], 7: [5, 9, 100]})
    stats.update("p", [1, 2])          # pending: folded into the snapshot
    back = LengthStats.from_dict(json.loads(json.dumps(stats.to_dict())))
    assert back.to_dict() == stats.to_dict()
    assert back.std(7) == stats.std(7) and back.rho() == stats.rho()


@pytest.mark.parametrize("kwargs, name", [({"prompt_decay": 1.0}, "prompt_decay"),
                                          ({"dataset_decay": -0.1}, "dataset_decay")])
def test_length_stats_bad_decay(kwargs, name):
    with pytest.raises(ValueError, match=name):
        LengthStats(**kwargs)


def test_length_stats_bad_lengths():
    stats = LengthStats()
    with pytest.raises(ValueError, match="empty"):
        stats.update("p", [])
    with pytest.raises(ValueError, match=r"lengths\[1\]"):
        stats.update("p", [3, -1])
    with pytest.raises(ValueError, match=r"lengths\[0\]"):
        stats.update("p", [float("nan")])


# -------------------------------------------------------------------- Eq. 8 / Eq. 9


def test_optimal_budget_eq8():
    assert optimal_budget(0.5, 0.25, 0.0625) == 32.0   # exact in binary


@pytest.mark.parametrize("rho, lam, k, expected", [
    (0.5, 0.25, 0.0625, 32),    # inside [MN, 2MN] = [20, 40]
    (0.5, 0.25, 0.06, 33),      # floor(33.33)
    (0.5, 0.25, 1.0, 20),       # 2 -> clipped up to MN
    (0.5, 0.25, 0.001, 40),     # 2000 -> clipped down to 2MN
    (0.0, 0.25, 1.0, 20),       # no variance: no redundancy
    (0.5, 0.25, 0.05, 40),      # exactly 2MN
    (0.5, 0.25, 0.1, 20),       # exactly MN
])
def test_adaptive_budget_eq9(rho, lam, k, expected):
    assert adaptive_budget(rho, lam, k, M=4, N=5) == expected


def test_lambda_for_budget_inverts_eq8():
    lam = lambda_for_budget(0.7, 3e-3, 1500.5)
    assert optimal_budget(0.7, lam, 3e-3) == pytest.approx(1500.5)
    assert adaptive_budget(0.7, lam, 3e-3, M=16, N=64) == 1500


@pytest.mark.parametrize("args, name", [
    ((-0.1, 1.0, 1.0, 2, 2), "rho"),
    ((0.5, 0.0, 1.0, 2, 2), "lam"),
    ((0.5, 1.0, -1.0, 2, 2), "k"),
    ((0.5, 1.0, float("inf"), 2, 2), "k"),
    ((0.5, 1.0, 1.0, 0, 2), "M"),
    ((0.5, 1.0, 1.0, 2, 0), "N"),
    ((0.5, 1.0, 1.0, 2.0, 2), "M"),
])
def test_adaptive_budget_validation(args, name):
    with pytest.raises(ValueError, match=rf"^{name} "):
        adaptive_budget(*args)


# ------------------------------------------------------------------------- Alg. 1


def test_minmax_norm():
    assert minmax_norm([3.0, 1.0, 2.0]) == [1.0, 0.0, 0.5]
    assert minmax_norm([7.0, 7.0]) == [1.0, 1.0]
    assert minmax_norm([]) == []


def test_marginal_gain():
    assert marginal_gain(1.0, 2) == pytest.approx(1 / 2 - 1 / 3)
    assert marginal_gain(0.5, 4) == pytest.approx(0.5 * (1 / 4 - 1 / 5))


def test_allocate_hand_computed():
    # w = [0, .5, 1]; from [2,2,2] add 3 units with M_up = 4:
    # Δ = [0, 1/12, 1/6] -> idx 2; Δ = [0, 1/12, 1/12] -> tie, idx 1; then idx 2.
    assert allocate([0.0, 5.0, 10.0], 9, 2, 4) == [2, 3, 4]


def test_allocate_ends_and_equal_weights():
    assert allocate([1.0, 2.0, 3.0], 6, 2, 4) == [2, 2, 2]          # N * M_low
    assert allocate([1.0, 2.0, 3.0], 12, 2, 4) == [4, 4, 4]         # N * M_up
    assert allocate([5.0, 5.0, 5.0], 8, 2, 4) == [3, 3, 2]          # ties: lower index
    # units with no gain (w = 0 after min-max) are spread evenly, not piled on index 0
    assert allocate([1.0, 1.0, 1.0, 2.0], 48, 8, 16) == [11, 11, 10, 16]
    assert allocate([4.0], 3, 3, 3) == [3]                           # M_low == M_up
    assert allocate([], 0, 1, 2) == []


def _alg1_literal(stds, m_total, m_low, m_up):
    """Alg. 1 as written: scan all candidates each iteration (the largest gain; ties: the
    fewest samples so far, then the lower index)."""
    w = minmax_norm(stds)
    alloc = [m_low] * len(stds)
    for _ in range(m_total - len(stds) * m_low):
        cands = [i for i in range(len(stds)) if alloc[i] < m_up]
        k = max(cands, key=lambda i: (w[i] * (1 / alloc[i] - 1 / (alloc[i] + 1)), -alloc[i], -i))
        alloc[k] += 1
    return alloc


def brute_force_allocate(stds, m_total, m_low, m_up):
    """The minimum of Eq. 5 over every feasible allocation."""
    w = minmax_norm(stds)
    return min(allocation_objective(w, a)
               for a in itertools.product(range(m_low, m_up + 1), repeat=len(stds))
               if sum(a) == m_total)


def test_allocate_matches_brute_force():
    rng = random.Random(1234)
    for _ in range(400):
        n = rng.randint(1, 4)
        m_low = rng.randint(1, 3)
        m_up = m_low + rng.randint(0, 4)
        pool = [0.0, 1.0, 2.5, 10.0]
        stds = [rng.choice(pool) if rng.random() < 0.4 else rng.uniform(0, 50)
                for _ in range(n)]
        m_total = rng.randint(n * m_low, n * m_up)
        alloc = allocate(stds, m_total, m_low, m_up)
        assert sum(alloc) == m_total
        assert all(m_low <= m <= m_up for m in alloc)
        got = allocation_objective(minmax_norm(stds), alloc)
        assert got == pytest.approx(brute_force_allocate(stds, m_total, m_low, m_up),
                                    rel=1e-12, abs=1e-12)
        # The heap reproduces the literal O(N * budget) algorithm, tie-breaks included.
        assert alloc == _alg1_literal(stds, m_total, m_low, m_up)


def test_allocate_large_batch_is_fast():
    rng = random.Random(7)
    stds = [rng.uniform(0, 3000) for _ in range(4096)]
    alloc = allocate(stds, 4096 * 16 * 3 // 2, 16, 32)
    assert sum(alloc) == 4096 * 24
    assert alloc[max(range(4096), key=stds.__getitem__)] == 32
    assert alloc[min(range(4096), key=stds.__getitem__)] == 16


@pytest.mark.parametrize("args, name", [
    (([1.0, 2.0], 3, 2, 4), "M_total"),          # below N * M_low
    (([1.0, 2.0], 9, 2, 4), "M_total"),          # above N * M_up
    (([1.0, 2.0], 6.0, 2, 4), "M_total"),        # not an int
    (([1.0, 2.0], 6, 0, 4), "M_low"),
    (([1.0, 2.0], 6, 3, 2), "M_up"),
    (([1.0, -2.0], 6, 2, 4), r"stds\[1\]"),
    (([float("nan")], 2, 2, 4), r"stds\[0\]"),
])
def test_allocate_validation(args, name):
    with pytest.raises(ValueError, match=rf"^{name} "):
        allocate(*args)


# ------------------------------------------------------------------ Alg. 2 / plans


def _stats_with(variances: dict[str, list[float]]) -> LengthStats:
    stats = LengthStats()
    stats.update_step(variances)
    return stats


def test_sampling_mode_switch():
    assert sampling_mode(8, 8) == "shortest"
    assert sampling_mode(7, 8) == "dual_end"


def test_plan_saturated_prompt_gets_shortest():
    stats = _stats_with({"hi": [10, 500], "lo": [100, 100], "mid": [100, 250]})
    k_cost = 2e-3
    lam = lambda_for_budget(stats.rho(), k_cost, 8.5)    # Eq. 8 -> 8.5 -> M_total 8
    plans = plan(["hi", "lo", "mid"], stats, M=2, lam=lam, k_cost=k_cost)
    # w = [1, 0, .5]: +1 to hi (Δ 1/6), then hi and mid tie at 1/12 -> hi (lower index).
    assert [p.n for p in plans] == [4, 2, 2]
    assert [p.mode for p in plans] == ["shortest", "dual_end", "dual_end"]
    assert [p.early_stop for p in plans] == [True, False, False]
    assert all(p.size == 2 and p.k == 1 and p.m_up == 4 for p in plans)
    assert [p.prompt_id for p in plans] == ["hi", "lo", "mid"]


def test_plan_cold_start_is_uniform_dual_end():
    plans = plan(range(5), LengthStats(), M=8, lam=1.0, k_cost=1.0)
    assert [p.n for p in plans] == [8] * 5
    assert {p.mode for p in plans} == {"dual_end"}
    assert {p.k for p in plans} == {7}


def test_plan_explicit_k_and_validation():
    stats = _stats_with({"a": [1, 2]})
    assert {p.k for p in plan(["a"], stats, 4, 1.0, 1.0, K=4)} == {4}
    with pytest.raises(ValueError, match="^K "):
        plan(["a"], stats, 4, 1.0, 1.0, K=5)
    with pytest.raises(ValueError, match="prompt_ids"):
        plan([], stats, 4, 1.0, 1.0)
    with pytest.raises(ValueError, match="^lam "):
        plan(["a"], stats, 4, 0.0, 1.0)


def test_prompt_plan_rl_params_plugs_into_flags():
    p = PromptPlan("q", n=16, size=8, mode="shortest", k=7, m_up=16)
    extra = p.rl_params()
    assert extra == {KEY: {"group": {"size": 8, "redundant": 16},
                           "darts": {"mode": "shortest", "k": 7, "m_up": 16}}}
    flags = parse(normalize(extra[KEY], n=p.n, default_group_id="g"))
    assert flags.group.redundant == 16 and flags.group.size == 8 and flags.group.id == "g"
    assert flags.darts.early_stop(flags.group)
    dual = PromptPlan("q", n=12, size=8, mode="dual_end", k=7, m_up=16)
    flags = parse(normalize(dual.rl_params(group_id="step3-q")[KEY], n=1))
    assert flags.group.id == "step3-q" and not flags.darts.early_stop(flags.group)


# --------------------------------------------------------------------------- Eq. 4


def test_rollout_cost_eq4_by_hand():
    ptl = {1: 1.0, 2: 1.5, 3: 2.5}.__getitem__
    # sorted [2, 5, 9]: 2*PTL(3) + 3*PTL(2) + 4*PTL(1) = 5 + 4.5 + 4
    assert rollout_cost([5, 2, 9], ptl) == pytest.approx(13.5)
    assert rollout_cost([4, 4, 4], ptl) == pytest.approx(10.0)   # 4*PTL(3)
    assert rollout_cost([], ptl) == 0.0
    with pytest.raises(ValueError, match=r"lengths\[0\]"):
        rollout_cost([-1], ptl)


def test_length_quantiles():
    assert length_quantiles([40, 0, 20, 10, 30], 5) == pytest.approx([4, 12, 20, 28, 36])
    assert length_quantiles([3], 4) == [3.0] * 4
    with pytest.raises(ValueError, match="samples"):
        length_quantiles([], 3)


def test_cost_slope_by_hand():
    # M = N = 1: budgets {1, 2}. T(1) = 50*PTL(1) = 50; T(2) = 25*PTL(2) + 50*PTL(1) = 100.
    assert cost_line(lambda b: float(b), [0, 100], M=1, N=1) == pytest.approx((50.0, 0.0))
    # Equal lengths L: T(B) = L * PTL(B) = L * (a + b*B), so k = L * b exactly.
    k = cost_slope(lambda b: 0.02 + 1e-4 * b, [300, 300, 300], M=8, N=32)
    assert k == pytest.approx(300 * 1e-4)


def test_cost_slope_positive_with_fitted_curve():
    def curve(b):                     # a three-piece PTL(batch size), as App. A fits
        knots, values = (1, 64, 256, 1024), (0.020, 0.024, 0.040, 0.120)
        b = min(max(b, knots[0]), knots[-1])
        i = next(j for j in range(1, 4) if b <= knots[j])
        t = (b - knots[i - 1]) / (knots[i] - knots[i - 1])
        return values[i - 1] + t * (values[i] - values[i - 1])
    rng = random.Random(3)
    lengths = [int(rng.lognormvariate(6, 0.8)) for _ in range(500)]
    assert cost_slope(curve, lengths, M=8, N=16) > 0
    with pytest.raises(ValueError, match="num_budgets"):
        cost_slope(curve, lengths, M=8, N=16, num_budgets=1)


# ------------------------------------------------------------------------- App. A


def test_predicted_step_cost_and_budget_choice():
    from vllm_rl.darts.rollout_budget import choose_budget, predicted_step_cost

    flat = lambda b: 1.0                                        # noqa: E731  compute-free
    # one prompt, M = 1: with 2 samples the group stops at the shorter one
    assert predicted_step_cost([1], [[10.0]], 1, flat) == pytest.approx(10.0)
    # a sample at the limit is cut, not valid: with M = 1 valid among [3, cap] -> stops at 3
    assert predicted_step_cost([2], [[3.0, 8.0]], 1, flat, max_tokens=8) == pytest.approx(3.0)
    # ... but with M = 2 only one is valid: the group runs to the end
    assert predicted_step_cost([2], [[3.0, 8.0]], 2, flat, max_tokens=8) == pytest.approx(8.0)
    lengths = [[2.0, 10.0]]
    assert predicted_step_cost([2], lengths, 1, flat) < predicted_step_cost([1], lengths, 1, flat)
    linear = lambda b: float(b)                                 # noqa: E731  cost per sequence
    steep = [[5.0, 5.0, 5.0, 5.0]]                              # no tail to cut: redundancy only costs
    assert predicted_step_cost([4], steep, 2, linear) > predicted_step_cost([2], steep, 2, linear)
    plans = {1.0: [2], 2.0: [4]}
    budget, plan, _ = choose_budget([2.0, 1.0], plans.__getitem__, steep, 2, linear)
    assert (budget, plan) == (1.0, [2])
    budget, plan, _ = choose_budget([1.0, 2.0], plans.__getitem__, [[1.0, 1.0, 50.0, 60.0]], 2,
                                    flat)
    assert (budget, plan) == (2.0, [4])


def test_dual_end_groups_never_stop_early():
    """Alg. 2: only a saturated (shortest-only) group stops at its M-th shortest valid
    sample; a dual-end group keeps its longest and runs every sample to its end."""
    from vllm_rl.darts.rollout_budget import predicted_step_cost

    flat = lambda b: 1.0                                        # noqa: E731
    lengths = [[2.0, 10.0]]
    assert predicted_step_cost([2], lengths, 1, flat, early_stop=[True]) == pytest.approx(2.0)
    assert predicted_step_cost([2], lengths, 1, flat, early_stop=[False]) == pytest.approx(10.0)
    with pytest.raises(ValueError, match="early_stop"):
        predicted_step_cost([2], lengths, 1, flat, early_stop=[True, False])


def test_draws_price_the_group_that_never_stops():
    """With many groups, one of them failing to get M valid samples sets the step's
    length; the quantile reading never sees it, the seeded draws do, deterministically."""
    from vllm_rl.darts.rollout_budget import choose_budget, predicted_step_cost

    linear = lambda b: 1.0 + 0.01 * b                           # noqa: E731
    # 64 prompts, each with 2 of 8 last samples at the limit (512)
    lengths = [[40.0, 60.0, 80.0, 100.0, 120.0, 150.0, 512.0, 512.0]] * 64
    quant = predicted_step_cost([16] * 64, lengths, 8, linear, 512, [True] * 64)
    drawn = predicted_step_cost([16] * 64, lengths, 8, linear, 512, [True] * 64, draws=16)
    assert drawn > quant
    assert drawn == predicted_step_cost([16] * 64, lengths, 8, linear, 512, [True] * 64,
                                        draws=16)
    plans = {1.0: [8] * 64, 2.0: [16] * 64}
    assert choose_budget([1.0, 2.0], plans.__getitem__, lengths, 8, linear, 512, m_up=16)[0] \
        == 2.0
    # the same prompts with half their samples at the limit: redundancy does not pay
    heavy = [[40.0, 60.0, 80.0, 100.0, 512.0, 512.0, 512.0, 512.0]] * 64
    assert choose_budget([1.0, 2.0], plans.__getitem__, heavy, 8, linear, 512, m_up=16,
                         draws=16)[0] == 1.0


def test_planner_chooses_the_total_with_the_batch_in_view():
    """budget='cost': 1.5 MN before lengths are known, then the multiple of MN the step-cost
    model predicts cheapest; a larger batch makes redundant samples dearer, never cheaper."""
    import random

    from vllm_rl.darts import DartsPlanner

    chosen = {}
    for n in (2, 256):
        planner = DartsPlanner(8, budget="cost", cost="h100:qwen3-8b", max_tokens=512)
        ids = list(range(n))
        plans = planner.plan(ids)
        assert planner.last_budget == 1.5 and sum(p.n for p in plans) == 12 * n
        rng = random.Random(0)
        planner.observe({i: [int(rng.lognormvariate(5, 0.6)) for _ in range(12)] for i in ids})
        plans = planner.plan(ids)
        chosen[n] = planner.last_budget
        assert chosen[n] in DartsPlanner.CANDIDATES
        assert sum(p.n for p in plans) == min(16 * n, max(8 * n, round(chosen[n] * 8 * n)))
    assert chosen[256] < chosen[2]
    # an engine that runs 2048 sequences at once at most: 256 prompts x 8 allows no more
    full = DartsPlanner(8, budget="cost", cost="h100:qwen3-8b", max_tokens=512, max_live=2048)
    full.observe({i: [10] * 11 + [500] for i in range(256)})
    full.plan(list(range(256)))
    assert full.last_budget == 1.0
    assert full.metrics["darts/off"] == 1.0 and full.metrics["darts/prompts_off"] == 256
    assert all(p.off and DartsPlanner.flags(p) == {} for p in full.plan(list(range(256))))
    with pytest.raises(ValueError, match="cost="):
        DartsPlanner(8, budget="cost", cost=None)
    assert DartsPlanner(8).budget == "adaptive"             # the default: Eq. 8-9
    with pytest.raises(ValueError, match="'cost'"):
        DartsPlanner(8, budget=2.5)


def test_planner_default_is_eq_8_9_with_lambda_calibrated_once():
    """budget='adaptive' (the default): 1.5 MN at the cold start; on the first step with
    lengths λ is calibrated so that Eq. 8 gives 1.5 MN; after that M_total = Eq. 9 of the
    new ρ_t and k_t exactly (guard off), and it rises with the length spread."""
    import random

    from vllm_rl.cost import load_cost
    from vllm_rl.darts import DartsPlanner
    from vllm_rl.darts.rollout_budget import adaptive_budget, cost_slope

    ids = list(range(16))
    planner = DartsPlanner(8, max_tokens=512, guard=False)
    assert planner.budget == "adaptive" and planner.lam is None
    planner.plan(ids)
    assert planner.last_budget == 1.5 and planner.metrics["darts/lambda"] == 0.0
    rng = random.Random(0)
    planner.observe({i: [int(rng.lognormvariate(5, 0.4)) for _ in range(12)] for i in ids})
    plans = planner.plan(ids)
    assert planner.lam > 0 and sum(p.n for p in plans) == 192          # 1.5 MN
    lam = planner.lam
    # a wider spread of lengths: ρ_t up, so the budget grows; λ stays
    wide = {i: [int(rng.lognormvariate(5, 1.2)) + 1 for _ in range(12)] for i in ids}
    planner.observe(wide)
    plans = planner.plan(ids)
    assert planner.lam == lam
    recent = [x for v in wide.values() for x in v]
    k = cost_slope(load_cost("h100").ptl(sum(recent) / len(recent) / 2), recent, 8, 16)
    expected = adaptive_budget(planner.stats.rho(), lam, k, 8, 16)
    assert sum(p.n for p in plans) == expected > 192
    # a λ given by the user is used as is, from the first step with lengths
    fixed = DartsPlanner(8, max_tokens=512, guard=False, lam=lam * 1000)
    fixed.observe(wide)
    assert sum(p.n for p in fixed.plan(ids)) == 128                    # clipped at MN
    with pytest.raises(ValueError, match="lam"):
        DartsPlanner(8, lam=0.0)


def test_planner_guard_turns_redundancy_off_where_the_model_says_it_is_slower():
    """With the guard (the project's option), a full batch whose groups run to the limit anyway
    gets 1.0 MN (DARTS off) and the metrics say the guard decided; a small batch where
    the long-tailed prompt saturates and stops early keeps Eq. 9's total; the cap
    ``max_live`` is respected."""
    from vllm_rl.darts import DartsPlanner

    tail = {0: [90, 95, 100, 100, 100, 105, 110, 110, 115, 120, 120, 125],
            1: [40, 50, 60, 70, 80, 90, 100, 110, 120, 130, 140, 500]}
    small = DartsPlanner(8, max_tokens=512, guard=True)
    small.observe(tail)
    small.plan([0, 1])
    assert small.last_budget > 1.0 and small.metrics["darts/cost_chosen"] == 0.0
    heavy = {i: [10] * 4 + [512] * 8 for i in range(256)}
    full = DartsPlanner(8, max_tokens=512, guard=True)
    full.observe(heavy)
    full.plan(list(range(256)))
    assert full.last_budget == 1.0 and full.metrics["darts/cost_chosen"] == 1.0
    assert full.metrics["darts/off"] == 1.0
    capped = DartsPlanner(8, max_tokens=512, guard=False, max_live=2100)
    capped.observe({i: [int(10 + 40 * j) for j in range(12)] for i in range(256)})
    assert sum(p.n for p in capped.plan(list(range(256)))) <= 2100
