"""DARTS's redundancy budget and its rollout-cost model (Sec. 4.2.1-4.2.2, App. A-B).

- Eq. 4: :func:`rollout_cost` of a group's sorted lengths on a PTL curve (per-token latency
  by batch size; :meth:`vllm_rl.cost.StepCost.ptl` gives one from the step-cost model, the
  one PTL the project plans with);
- Eq. 6: the cost line T(M̄) ≈ k M̄ + c over the budget (:func:`cost_line`, :func:`cost_slope`);
- Eq. 8-9: the total budget M_total = clip(ρ / (λ k), MN, 2MN) (:func:`optimal_budget`,
  :func:`adaptive_budget`, :func:`lambda_for_budget`);
- a step's predicted cost under shortest-M early stop, and the budget whose plan costs least
  (:func:`predicted_step_cost`, :func:`choose_budget`).

Pure Python, deterministic.
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from vllm_rl.checks import check_int as _check_int
from vllm_rl.checks import check_real as _check_real
from vllm_rl.darts.controller import _check_lengths


def optimal_budget(rho: float, lam: float, k: float) -> float:
    """Eq. 8: M̄* = ρ / (λ k), where dU/dM̄ = 0 for U(M̄) = ρ ln M̄ − λ (k M̄ + c).

    ``lam`` and ``k`` must use the same time unit (``k`` is seconds per sample if
    the PTL curve is in seconds per token).
    """
    rho = _check_real("rho", rho, lo=0.0)
    lam = _check_real("lam", lam, lo=0.0, strict=True)
    k = _check_real("k", k, lo=0.0, strict=True)
    return rho / (lam * k)


def adaptive_budget(rho: float, lam: float, k: float, M: int, N: int) -> int:
    """Eq. 9: M_total = clip(floor(M̄*), MN, 2MN) with M̄* of Eq. 8."""
    M = _check_int("M", M, 1)
    N = _check_int("N", N, 1)
    m_star = optimal_budget(rho, lam, k)
    lo, hi = M * N, 2 * M * N
    if m_star >= hi:
        return hi
    return max(lo, math.floor(m_star))


def lambda_for_budget(rho: float, k: float, budget: float) -> float:
    """The λ for which Eq. 8 yields ``budget``: λ = ρ / (k · budget).

    A way to pick λ: calibrate it once so that today's ρ gives, e.g., the paper's
    typical 1.5·MN (App. B); the budget then follows ρ as training goes on.
    """
    rho = _check_real("rho", rho, lo=0.0, strict=True)
    k = _check_real("k", k, lo=0.0, strict=True)
    budget = _check_real("budget", budget, lo=0.0, strict=True)
    return rho / (k * budget)


def rollout_cost(lengths: Sequence[float], ptl: Callable[[int], float]) -> float:
    """Eq. 4: T = Σ_m (l_[m] − l_[m−1]) · PTL(M' − m + 1) over sorted lengths, l_[0] = 0.

    Between the (m−1)-th and m-th completion, ``M' − m + 1`` samples are still
    generating, each step at that batch size's per-token latency.
    """
    ordered = sorted(_check_lengths("lengths", lengths))
    n = len(ordered)
    total, previous = 0.0, 0.0
    for m, length in enumerate(ordered, start=1):
        if length > previous:
            total += (length - previous) * ptl(n - m + 1)
        previous = length
    return total


def length_quantiles(samples: Sequence[float], count: int) -> list[float]:
    """``count`` deterministic draws from the empirical length distribution.

    The quantiles at probabilities (j − ½)/count, j = 1..count, with linear
    interpolation between order statistics (position p·(n−1), numpy's default).
    """
    ordered = sorted(_check_lengths("samples", samples))
    if not ordered:
        raise ValueError("samples must not be empty")
    count = _check_int("count", count, 1)
    last = len(ordered) - 1
    out = []
    for j in range(1, count + 1):
        pos = (j - 0.5) / count * last
        lo = math.floor(pos)
        hi = min(lo + 1, last)
        out.append(ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo))
    return out


def _line_fit(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Ordinary least squares ``y = slope·x + intercept``."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    return slope, my - slope * mx


def cost_line(ptl: Callable[[int], float], mean_length_samples: Sequence[float], M: int,
              N: int, num_budgets: int = 16) -> tuple[float, float]:
    """Eq. 6: T(M̄) ≈ k·M̄ + c, as ``(k, c)``, from the cost model of Eq. 4.

    Exactly: take ``num_budgets`` budgets B evenly spaced over [MN, 2MN] (rounded,
    duplicates dropped; both ends included).  For each, model one rollout of the
    whole step — B samples generating together, so the PTL batch size is the number
    still running — with the B lengths :func:`length_quantiles` draws from
    ``mean_length_samples`` (recent response lengths, an empirical sample of the
    length distribution), and cost it by :func:`rollout_cost`.  Then fit a line to
    (B, T(B)) by least squares.
    """
    M = _check_int("M", M, 1)
    N = _check_int("N", N, 1)
    num_budgets = _check_int("num_budgets", num_budgets, 2)
    lo = M * N
    budgets = sorted({round(lo + lo * j / (num_budgets - 1)) for j in range(num_budgets)})
    costs = [rollout_cost(length_quantiles(mean_length_samples, b), ptl) for b in budgets]
    return _line_fit(budgets, costs)


def cost_slope(ptl: Callable[[int], float], mean_length_samples: Sequence[float], M: int,
               N: int, num_budgets: int = 16) -> float:
    """k of Eq. 6 (the time per extra sample of budget): see :func:`cost_line`."""
    return cost_line(ptl, mean_length_samples, M, N, num_budgets)[0]


def predicted_step_cost(redundant: Sequence[int], lengths_by_prompt: Sequence[Sequence[float]],
                        M: int, ptl: Callable[[int], float],
                        max_tokens: float | None = None) -> float:
    """Eq. 4 over a whole step under shortest-M early stop, from the previous step.

    Prompt i generates ``redundant[i]`` samples whose lengths are drawn from its previous
    lengths (deterministic nearest-rank quantiles at (j − ½)/n, so a length cut at the
    limit stays at the limit).  A sample reaching ``max_tokens`` is cut, not a valid
    answer: its group stops when its M-th shortest *valid* sample finishes, and the rest
    run only that long; a group with fewer than M valid runs to the end.  All groups
    generate together: the step costs :func:`rollout_cost` of every sample's effective
    length, priced at the number still running.  More redundancy cuts the long tail but
    widens the batch; with a step-cost model's PTL (``StepCost.ptl``) this says which
    wins on the target hardware.
    """
    M = _check_int("M", M, 1)
    effective: list[float] = []
    for n, lengths in zip(redundant, lengths_by_prompt, strict=True):
        n = _check_int("redundant", n, M)
        ordered = sorted(_check_lengths("lengths", lengths))
        if not ordered:
            raise ValueError("lengths_by_prompt: every prompt needs a length")
        drawn = [ordered[min(len(ordered) - 1, int((j + 0.5) / n * len(ordered)))]
                 for j in range(n)]
        valid = [x for x in drawn if max_tokens is None or x < max_tokens]
        if len(valid) >= M:
            cut = valid[M - 1]
            drawn = [min(x, cut) for x in drawn]
        effective += drawn
    return rollout_cost(effective, ptl)


def choose_budget(candidates: Sequence[float], plan_for: Callable[[float], Sequence[int]],
                  lengths_by_prompt: Sequence[Sequence[float]], M: int,
                  ptl: Callable[[int], float],
                  max_tokens: float | None = None) -> tuple[float, list[int], float]:
    """The total budget (a multiple of M·N) whose plan (``plan_for(budget)`` → M' per
    prompt) has the smallest :func:`predicted_step_cost`; ties: the smaller budget.
    Returns (budget, plan, predicted cost)."""
    best = None
    for budget in sorted(candidates):
        ns = list(plan_for(budget))
        cost = predicted_step_cost(ns, lengths_by_prompt, M, ptl, max_tokens)
        if best is None or cost < best[2] * (1 - 1e-9):
            best = (budget, ns, cost)
    if best is None:
        raise ValueError("choose_budget: no candidates")
    return best


__all__ = ["adaptive_budget", "choose_budget", "cost_line", "cost_slope", "lambda_for_budget",
           "length_quantiles", "optimal_budget", "predicted_step_cost", "rollout_cost"]
