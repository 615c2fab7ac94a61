"""DARTS's redundancy budget and its rollout-cost model (Sec. 4.2.1-4.2.2, App. A-B).

- Eq. 4: :func:`rollout_cost` of a group's sorted lengths on a PTL curve (per-token latency
  by batch size; :meth:`vllm_rl.cost.StepCost.ptl` gives one from the step-cost model, the
  one PTL the project plans with);
- Eq. 6: the cost line T(M̄) ≈ k M̄ + c over the budget (:func:`cost_line`, :func:`cost_slope`);
- Eq. 8-9: the total budget M_total = clip(ρ / (λ k), MN, 2MN) (:func:`optimal_budget`,
  :func:`adaptive_budget`, :func:`lambda_for_budget`);
- a step's predicted cost under shortest-M early stop, and the budget whose plan costs least
  (:func:`predicted_step_cost`, :func:`choose_budget`).

Pure Python and numpy, deterministic (the Monte Carlo draws are seeded).
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence

import numpy as np

from vllm_rl.checks import check_lengths
from vllm_rl.checks import check_int as _check_int
from vllm_rl.checks import check_real as _check_real


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
    ordered = sorted(check_lengths("lengths", lengths))
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
    ordered = sorted(check_lengths("samples", samples))
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


PRIOR_SAMPLES = 4.0     # pseudo-samples of the pooled lengths in each prompt's resampling
DRAWS = 16              # Monte Carlo draws of a step in the planner's prediction


def _effective(redundant: Sequence[int], lengths_by_prompt: Sequence[Sequence[float]],
               M: int, max_tokens: float | None, early_stop: Sequence[bool] | None,
               draws: int, seed: int, prior: float) -> list[np.ndarray]:
    """Each draw's effective lengths of every sample of the step (see
    :func:`predicted_step_cost`)."""
    rows = []
    for n, lengths in zip(redundant, lengths_by_prompt, strict=True):
        n = _check_int("redundant", n, M)
        ordered = sorted(check_lengths("lengths", lengths))
        if not ordered:
            raise ValueError("lengths_by_prompt: every prompt needs a length")
        rows.append((n, ordered))
    stop = (np.ones(len(rows), dtype=bool) if early_stop is None
            else np.asarray(list(early_stop), dtype=bool))
    if len(stop) != len(rows):
        raise ValueError("early_stop: one entry per prompt")
    limit = math.inf if max_tokens is None else float(max_tokens)
    if draws == 0:                    # each prompt's quantiles at (j + 1/2) / n
        x = [np.array([o[min(len(o) - 1, int((j + 0.5) / n * len(o)))] for j in range(n)])
             for n, o in rows]
        samples = [_cut(x, stop, M, limit)]
        return samples
    N, S = len(rows), max(n for n, _ in rows)
    K = max(len(o) for _, o in rows)
    own = np.zeros((N, K))
    k = np.array([len(o) for _, o in rows], dtype=np.float64)
    for i, (_, o) in enumerate(rows):
        own[i, :len(o)] = o
    n = np.array([n for n, _ in rows])
    pooled = np.concatenate([np.asarray(o, dtype=np.float64) for _, o in rows])
    live = np.arange(S)[None, :] < n[:, None]
    rng = np.random.default_rng(seed)
    w = (k / (k + prior))[:, None]
    out = []
    for _ in range(draws):
        pick = np.minimum((rng.random((N, S)) * k[:, None]).astype(np.int64), K - 1)
        x = np.where(rng.random((N, S)) < w, own[np.arange(N)[:, None], pick],
                     pooled[rng.integers(0, len(pooled), (N, S))])
        valid = live & (x < limit)
        if M <= S:
            cut = np.sort(np.where(valid, x, np.inf), axis=1)[:, M - 1]
            x = np.where(stop[:, None], np.minimum(x, cut[:, None]), x)
        out.append(x[live])
    return out


def _cut(x: list[np.ndarray], stop: np.ndarray, M: int, limit: float) -> np.ndarray:
    """Shortest-M early stop of each stopping group (its M-th shortest valid sample)."""
    parts = []
    for xi, s in zip(x, stop):
        valid = np.sort(xi[xi < limit])
        parts.append(np.minimum(xi, valid[M - 1]) if s and len(valid) >= M else xi)
    return np.concatenate(parts) if parts else np.zeros(0)


def _rollout_cost_array(lengths: np.ndarray, ptl_table: np.ndarray) -> float:
    """:func:`rollout_cost` over an array, with ``ptl_table[b] = PTL(b)``."""
    e = np.sort(lengths)
    n = len(e)
    steps = np.diff(e, prepend=0.0)
    return float(steps @ ptl_table[n - np.arange(n)])


def predicted_step_cost(redundant: Sequence[int], lengths_by_prompt: Sequence[Sequence[float]],
                        M: int, ptl: Callable[[int], float],
                        max_tokens: float | None = None,
                        early_stop: Sequence[bool] | None = None, draws: int = 0,
                        seed: int = 0, prior: float = PRIOR_SAMPLES) -> float:
    """Eq. 4 over a whole step, from each prompt's previous lengths.

    Prompt i generates ``redundant[i]`` samples.  A sample reaching ``max_tokens`` is
    cut, not a valid answer.  A group that stops early (``early_stop[i]``, Alg. 2 l.12:
    shortest-only, M'_i = M_up; every group when ``early_stop`` is None) stops when its
    M-th shortest *valid* sample finishes and the rest run only that long; a group with
    fewer than M valid, and a dual-end group (Alg. 2 l.5-9: it keeps its longest valid
    samples, so it never stops early), runs every sample to its end.  All groups
    generate together: the step costs :func:`rollout_cost` of every sample's effective
    length, priced at the number still running.  More redundancy cuts the long tail but
    widens the batch; with a step-cost model's PTL (``StepCost.ptl``) this says which
    wins on the target hardware.

    The lengths: ``draws=0``, each prompt's deterministic nearest-rank quantiles at
    (j + ½)/n (a length cut at the limit stays at the limit); ``draws > 0``, the mean
    over that many Monte Carlo draws of the step (seeded: deterministic), each sample
    drawn from its prompt's lengths with probability k_i / (k_i + ``prior``) and from
    every prompt's pooled lengths otherwise (k_i: the prompt's count; a shrinkage
    bootstrap, so a prompt whose few last samples all finished can still run to the
    limit).  A step is as long as its slowest group: with many groups, the chance that
    one of them never gets M valid samples is what decides whether redundancy pays, and
    only the draws see it.
    """
    M = _check_int("M", M, 1)
    draws = _check_int("draws", draws, 0)
    samples = _effective(redundant, lengths_by_prompt, M, max_tokens, early_stop, draws,
                         seed, _check_real("prior", prior, lo=0.0))
    top = max((len(x) for x in samples), default=0)
    table = np.array([0.0] + [float(ptl(b)) for b in range(1, top + 1)])
    return statistics.fmean(_rollout_cost_array(x, table) for x in samples) if top else 0.0


def choose_budget(candidates: Sequence[float], plan_for: Callable[[float], Sequence[int]],
                  lengths_by_prompt: Sequence[Sequence[float]], M: int,
                  ptl: Callable[[int], float],
                  max_tokens: float | None = None, m_up: int | None = None,
                  draws: int = 0, seed: int = 0) -> tuple[float, list[int], float]:
    """The total budget (a multiple of M·N) whose plan (``plan_for(budget)`` → M' per
    prompt) has the smallest :func:`predicted_step_cost`; ties: the smaller budget.
    With ``m_up``, only the prompts at M'_i ≥ ``m_up`` stop early (Alg. 2's modes).
    Every candidate is priced on the same draws (common random numbers).
    Returns (budget, plan, predicted cost)."""
    best = None
    for budget in sorted(candidates):
        ns = list(plan_for(budget))
        stop = None if m_up is None else [n >= m_up for n in ns]
        cost = predicted_step_cost(ns, lengths_by_prompt, M, ptl, max_tokens, stop,
                                   draws, seed)
        if best is None or cost < best[2] * (1 - 1e-9):
            best = (budget, ns, cost)
    if best is None:
        raise ValueError("choose_budget: no candidates")
    return best


__all__ = ["adaptive_budget", "choose_budget", "cost_line", "cost_slope", "lambda_for_budget",
           "length_quantiles", "optimal_budget", "predicted_step_cost", "rollout_cost"]
