"""DUET's pre-rollout allocation: how many rollouts each prompt gets (Sec. 3.1, Theorem 1, Eq.
2 / Eq. 4).

The per-step token budget ``B`` is split by the cost-weighted Neyman rule n_q = σ_q / (λ
sqrt(L̄_q)) (the square root restored from the proof of Theorem 1; ``docs/duet_notes.md``),
with λ* found by bisection warm-started at the previous step's (Alg. A.10 l.6):
:func:`allocate`.  The continuous optimum (:func:`neyman_allocation`,
:func:`neyman_variance`) is the reference the integer allocation tracks.  Pure Python,
deterministic.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any
from vllm_rl.checks import check_int as _check_int
from vllm_rl.checks import check_real as _check_real
from vllm_rl.checks import check_same_length as _check_same_length


N_MIN = 2


_MAX_EXPANSIONS = 4096


def _check_reals(name: str, values: Iterable[Any], lo: float | None = None,
                 strict: bool = False) -> list[float]:
    return [_check_real(f"{name}[{i}]", v, lo, strict) for i, v in enumerate(values)]


def _check_n_max(n_max: Any, n_min: int) -> int | None:
    return None if n_max is None else _check_int("n_max", n_max, n_min)


def _neyman_inputs(sigmas: Sequence[float], lengths: Sequence[float],
                   budget: float) -> tuple[list[float], list[float], float]:
    sigmas = _check_reals("sigmas", sigmas, lo=0.0)
    lengths = _check_reals("lengths", lengths, lo=0.0, strict=True)
    _check_same_length(sigmas=sigmas, lengths=lengths)
    if not sigmas:
        raise ValueError("sigmas must not be empty")
    if not any(sigmas):
        raise ValueError("sigmas must have a positive entry (all zero: no variance to allocate)")
    return sigmas, lengths, _check_real("budget", budget, lo=0.0, strict=True)


def neyman_lambda(sigmas: Sequence[float], lengths: Sequence[float], budget: float) -> float:
    """Theorem 1's budget-closing λ* = S / B, S = Σ_q σ_q sqrt(L̄_q) (App. A.2.3)."""
    sigmas, lengths, budget = _neyman_inputs(sigmas, lengths, budget)
    return math.fsum(s * math.sqrt(L) for s, L in zip(sigmas, lengths)) / budget


def neyman_allocation(sigmas: Sequence[float], lengths: Sequence[float],
                      budget: float) -> list[float]:
    """Eq. 2: n*_q = σ_q / (λ* sqrt(L̄_q)) = (B / S) σ_q / sqrt(L̄_q); Σ_q n*_q L̄_q = B.

    The real-valued minimiser of V(n) = Σ σ_q² / n_q (Eq. 1) under the token budget.
    """
    lam = neyman_lambda(sigmas, lengths, budget)
    return [s / (lam * math.sqrt(L)) for s, L in zip(sigmas, lengths)]


def neyman_variance(sigmas: Sequence[float], lengths: Sequence[float], budget: float) -> float:
    """Theorem 1's minimum V* = S² / B (= λ*² B with the λ* of :func:`neyman_lambda`)."""
    sigmas, lengths, budget = _neyman_inputs(sigmas, lengths, budget)
    S = math.fsum(s * math.sqrt(L) for s, L in zip(sigmas, lengths))
    return S * S / budget


def allocation_variance(sigmas: Sequence[float], counts: Sequence[float]) -> float:
    """Eq. 1: V(n) = Σ_q σ_q² / n_q."""
    sigmas = _check_reals("sigmas", sigmas, lo=0.0)
    counts = _check_reals("counts", counts, lo=0.0, strict=True)
    _check_same_length(sigmas=sigmas, counts=counts)
    return math.fsum(s * s / n for s, n in zip(sigmas, counts))


def allocation_cost(counts: Sequence[float], lengths: Sequence[float]) -> float:
    """The step's expected token count Σ_q n_q L̂_q (Sec. 2), the quantity capped at B."""
    counts = _check_reals("counts", counts, lo=0.0)
    lengths = _check_reals("lengths", lengths, lo=0.0)
    _check_same_length(counts=counts, lengths=lengths)
    return math.fsum(n * L for n, L in zip(counts, lengths))


def eq4_count(score: float, length: float, lam: float, n_min: int = N_MIN,
              n_max: int | None = None) -> int:
    """Eq. 4 for one prompt: n_q = max(n_min, round(ŝ_q / (λ sqrt(L̂_q)))).

    ``round`` is round-half-up, floor(x + ½) (Python's ``round`` rounds halves to even,
    which would make the rule depend on parity); ``n_max`` optionally caps n_q.
    """
    score = _check_real("score", score, lo=0.0, strict=True)
    length = _check_real("length", length, lo=0.0, strict=True)
    lam = _check_real("lam", lam, lo=0.0, strict=True)
    n_min = _check_int("n_min", n_min, 1)
    return _count(score, math.sqrt(length), lam, n_min, _check_n_max(n_max, n_min))


def _priority(score: float, root: float, k: int) -> float:
    """β_{q,k} = ŝ_q / ((k + ½) sqrt(L̂_q)): Eq. 4 gives prompt q its (k+1)-th rollout
    exactly when λ ≤ β_{q,k} (k ≥ n_min), since round(x) ≥ k + 1 ⟺ x ≥ k + ½."""
    return score / ((k + 0.5) * root)


def _count(score: float, root: float, lam: float, n_min: int, n_max: int | None) -> int:
    """Eq. 4's n_q at λ, computed as n_min + #{k ≥ n_min: β_{q,k} ≥ λ} (capped at n_max)
    so that it agrees bit-for-bit with :func:`_priority`: the closed form
    floor(x + ½) is only the first guess, corrected at the boundary."""
    x = score / (lam * root)
    if not math.isfinite(x):
        raise ValueError(f"lam must leave ŝ / (λ sqrt(L̂)) finite, got lam={lam!r}")
    count = max(n_min, math.floor(x + 0.5))
    if n_max is not None:
        count = min(count, n_max)
    while count > n_min and _priority(score, root, count - 1) < lam:
        count -= 1
    while (n_max is None or count < n_max) and _priority(score, root, count) >= lam:
        count += 1
    return count


def _as_integers(values: Sequence[float]) -> tuple[list[int], int]:
    """Exact integers a_i and a common denominator D (a power of 2) with v_i = a_i / D,
    so that budget comparisons are exact and do not depend on the order of additions."""
    ratios = [v.as_integer_ratio() for v in values]
    denom = max(d for _, d in ratios)
    return [n * (denom // d) for n, d in ratios], denom


@dataclass(frozen=True)
class Allocation:
    """The result of :func:`allocate`.

    ``counts`` are the n_q, ``cost`` = Σ n_q L̂_q, ``lam`` a λ at which Eq. 4 gives
    ``counts`` (unless the budget splits a tie, see :func:`allocate`; it warm-starts the
    next step), ``feasible`` says whether n_min Σ L̂ ≤ B ≤ n_max Σ L̂, and
    ``evaluations`` counts the evaluations of C(λ) = Σ_q n_q(λ) L̂_q.
    """

    counts: tuple[int, ...]
    lam: float
    cost: float
    budget: float
    feasible: bool
    evaluations: int


def allocate(scores: Sequence[float], lengths: Sequence[float], budget: float,
             n_min: int = N_MIN, n_max: int | None = None, lam0: float | None = None,
             cap: bool = False, max_iter: int = 10) -> Allocation:
    """Eq. 4 under the budget: n_q = max(n_min, round(ŝ_q / (λ* sqrt(L̂_q)))) with λ* such
    that Σ_q n_q L̂_q closes the token budget B (Theorem 1 with the surrogate of Sec. 3.1).

    **Why λ alone cannot close the budget.**  C(λ) = Σ_q n_q(λ) L̂_q is a step function of
    λ: rounding makes it jump by L̂_q each time some ŝ_q / (λ sqrt(L̂_q)) crosses k + ½,
    and by the sum of several lengths at once when prompts tie (a cold batch, where
    every ŝ_q = s_floor and every L̂_q is the same, jumps by M·L̂ at a single λ).
    n_min removes steps (a prompt clipped at n_min does not move) and makes the problem
    infeasible when n_min Σ L̂ > B: every prompt then gets n_min and the budget is
    overrun (``feasible=False``); likewise every prompt gets n_max when B > n_max Σ L̂.

    **What this computes.**  Eq. 4 hands out rollouts in a fixed order: the (k+1)-th
    rollout of prompt q (k ≥ n_min) is there iff λ ≤ β_{q,k} = ŝ_q / ((k+½) sqrt(L̂_q)).
    Sort all these units by β descending (ties: lower prompt index first).  The answer
    is the longest prefix of that order costing ≤ B, plus the next unit if that brings
    the cost strictly closer to B (``cap=False``, the default: |C − B| ≤ ½ L̂ of that
    unit) or never (``cap=True``: 0 ≤ B − C < L̂ of that unit).  Either way, whenever
    feasible, |Σ_q n_q L̂_q − B| ≤ max_q L̂_q.  Any λ strictly between the β of the last
    unit taken and of the first left out gives these counts through Eq. 4 (``lam`` is
    their geometric mean); when the budget splits a tie no λ does, and the tie-break
    decides.  Budget comparisons are exact (integer arithmetic on the floats' values).

    **How.**  Bisection on λ in log space (the paper: "a few bisection iterations
    warm-started from λ*_{t−1}"; Alg. A.10 line 6 runs 10).  From ``lam0`` (the previous
    step's λ*, clamped to where the answer can lie; default the continuous λ of
    :func:`neyman_lambda`) the bracket is widened (steps of ×1.016, squared each time
    up to ×2) until C(λ_lo) ≥ B ≥ C(λ_hi), then halved at most ``max_iter`` times
    (default 10, as in the paper), stopping early once it holds a single unit or a
    single tie group; the units between the two ends are then taken in the order
    above.  The result is thus the same for every ``lam0`` and ``max_iter``: they only
    change how long the final walk is.
    """
    scores = _check_reals("scores", scores, lo=0.0, strict=True)
    lengths = _check_reals("lengths", lengths, lo=0.0, strict=True)
    m = _check_same_length(scores=scores, lengths=lengths)
    if m == 0:
        raise ValueError("scores must not be empty")
    budget = _check_real("budget", budget, lo=0.0, strict=True)
    n_min = _check_int("n_min", n_min, 1)
    n_max = _check_n_max(n_max, n_min)
    if lam0 is not None:
        lam0 = _check_real("lam0", lam0, lo=0.0, strict=True)
    if not isinstance(cap, bool):
        raise ValueError(f"cap must be a bool, got {type(cap).__name__}")
    max_iter = _check_int("max_iter", max_iter, 0)

    roots = [math.sqrt(L) for L in lengths]
    ints, denom = _as_integers(lengths + [budget])
    steps, target = ints[:m], ints[m]             # L̂_q = steps[q] / denom, B = target / denom
    total = sum(steps)
    evaluations = 0

    def counts_at(lam: float) -> tuple[list[int], int]:
        nonlocal evaluations
        evaluations += 1
        counts = [_count(s, r, lam, n_min, n_max) for s, r in zip(scores, roots)]
        return counts, sum(n * a for n, a in zip(counts, steps))

    def result(counts: list[int]) -> Allocation:
        feasible = n_min * total <= target and (n_max is None or target <= n_max * total)
        lam = _reproducing_lambda(counts, scores, roots, n_min, n_max, budget)
        cost = sum(n * a for n, a in zip(counts, steps)) / denom
        return Allocation(tuple(counts), lam, cost, budget, feasible, evaluations)

    if target <= n_min * total:
        return result([n_min] * m)
    if n_max is not None and target >= n_max * total:
        return result([n_max] * m)

    # Start: λ_{t−1}, clamped to [S / (B + ΣL̂/2), 2 max_q β_{q,n_min}].  Below the lower
    # end C(λ) ≥ S/λ − ΣL̂/2 ≥ B already; above the upper end every n_q = n_min.
    S = math.fsum(s * r for s, r in zip(scores, roots))
    if lam0 is None:
        lam = S / budget
    else:
        top = 2.0 * max(_priority(s, r, n_min) for s, r in zip(scores, roots))
        lam = min(max(lam0, S / (budget + math.fsum(lengths) / 2.0)), top)
    at_lam, cost = counts_at(lam)
    if cost == target:               # S(λ) costs exactly B: it is the answer
        return result(at_lam)

    # Bracket: C(lo) ≥ B ≥ C(hi), C non-increasing in λ.  The step starts at 1/64 (a
    # good warm start gives a tight bracket) and squares up to a factor of 2.
    lo = hi = lam
    lo_counts = hi_counts = at_lam
    factor = 1.0 + 1.0 / 64.0
    for _ in range(_MAX_EXPANSIONS):
        if cost > target:            # λ too small: move both ends up
            lo, lo_counts = hi, hi_counts
            hi *= factor
            hi_counts, cost = counts_at(hi)
            if cost <= target:
                break
        else:                        # λ too large: move both ends down
            hi, hi_counts = lo, lo_counts
            lo /= factor
            lo_counts, cost = counts_at(lo)
            if cost >= target:
                break
        factor = min(factor * factor, 2.0)
    else:  # pragma: no cover - the clamped start is within a few doublings
        raise RuntimeError("allocate: could not bracket the budget")

    # Bisection in log space while the bracket holds more than one unit.
    for _ in range(max_iter):
        width = sum(a - b for a, b in zip(lo_counts, hi_counts))
        if width <= 1 or width <= m and len({
                _priority(scores[q], roots[q], k)
                for q in range(m) for k in range(hi_counts[q], lo_counts[q])}) == 1:
            break                    # one unit, or one tie group: bisection cannot split it
        mid = math.sqrt(lo) * math.sqrt(hi)
        if not lo < mid < hi:        # adjacent floats: a tie group is left
            break
        mid_counts, cost = counts_at(mid)
        if cost >= target:
            lo, lo_counts = mid, mid_counts
        if cost <= target:
            hi, hi_counts = mid, mid_counts

    # Walk the units between the ends in Eq. 4's order (β descending, then index).
    units = sorted(((_priority(scores[q], roots[q], k), q)
                    for q in range(m) for k in range(hi_counts[q], lo_counts[q])),
                   key=lambda u: (-u[0], u[1]))
    counts = list(hi_counts)
    cost = sum(n * a for n, a in zip(counts, steps))
    for _, q in units:
        step = steps[q]
        if cost + step <= target:
            counts[q] += 1
            cost += step
            continue
        if not cap and 2 * cost + step < 2 * target:    # strictly closer above than below
            counts[q] += 1
        break
    return result(counts)


def _reproducing_lambda(counts: Sequence[int], scores: Sequence[float],
                        roots: Sequence[float], n_min: int, n_max: int | None,
                        budget: float) -> float:
    """A λ at which Eq. 4 gives ``counts``: the geometric mean of the β of the last unit
    taken and of the first left out (half / twice one of them at the ends)."""
    taken = [_priority(s, r, n - 1) for s, r, n in zip(scores, roots, counts) if n > n_min]
    left = [_priority(s, r, n) for s, r, n in zip(scores, roots, counts)
            if n_max is None or n < n_max]
    if taken and left:
        return math.sqrt(min(taken)) * math.sqrt(max(left))
    if taken:
        return min(taken) / 2.0
    if left:
        return max(left) * 2.0
    return math.fsum(s * r for s, r in zip(scores, roots)) / budget   # n_min == n_max


__all__ = ["Allocation", "N_MIN", "allocate", "allocation_cost", "allocation_variance", "eq4_count",
           "neyman_allocation", "neyman_lambda", "neyman_variance"]
