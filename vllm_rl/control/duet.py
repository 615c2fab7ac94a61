"""DUET on the trainer side: how many rollouts each prompt gets, and how kept ones weigh.

DUET (Hu et al., arXiv:2605.08441) splits a per-step token budget ``B`` over the prompts
of a batch and stops rollouts early in the engine.  Each step the trainer (Sec. 3.1-3.3,
Alg. A.10):

1. scores each prompt with the running surrogate ŝ_q = max(s_floor, σ̂_q^obs) of Sec. 3.1
   (:meth:`DuetController.score`) and estimates its expected rollout length L̂_q
   (:meth:`DuetController.length`);
2. splits ``B`` by the cost-weighted Neyman rule (Theorem 1, Eq. 2 / Eq. 4), λ* found by
   bisection warm-started at the previous step's λ*: :func:`allocate`;
3. sends n_q rollouts per prompt; the engine applies the marker-gated abort (Sec. 3.2,
   Eq. 5; see ``docs/duet_notes.md``) and reports every rollout as :data:`KEPT`,
   :data:`EPS_KEPT` or :data:`ABORTED`;
4. weights the rollouts in the GRPO loss by Eq. 6: :func:`loss_weights`;
5. feeds the step back (Alg. A.10 Phase 4): :meth:`DuetController.observe`.

:class:`DuetController` holds the running state and ties the steps together::

    duet = DuetController(initial_length=1000.0)
    for each step:
        counts = duet.allocate(prompt_ids, budget)            # {prompt_id: n_q}
        ...generate counts[q] rollouts of q; each comes back kept / eps_kept / aborted...
        weights = duet.loss_weights(statuses)                 # {prompt_id: [w_qi, ...]}
        ...GRPO loss of Eq. 6 with these weights, backward...
        for q in prompt_ids:
            duet.observe(q, advantages[q], seq_logprobs[q], lengths[q], statuses[q])
        at the end of the first epoch: duet.end_epoch()      # freezes s_floor (App. A.3)

**The square root.**  The HTML of the paper drops radicals, so Eq. 2 and Eq. 4 read
``n_q = σ_q / (λ* L̄_q)``.  The proof of Theorem 1 (App. A.2.3) fixes them: stationarity
σ_q²/n_q² = λ L̄_q, the budget gives λ* = S/B with S = Σ_q σ_q sqrt(L̄_q) (the "Neyman
normalizer" of A.2.1), n*_q = (B/S) σ_q / sqrt(L̄_q), and V* = S²/B; the uniform-
allocation corollary (Cauchy-Schwarz, equality iff σ_q/sqrt(L̄_q) is constant) and Sec.
3.1's "square-root cost factor" only hold with the root.  So this module implements
n_q = σ_q / (λ sqrt(L̄_q)), where λ is the square root of the Lagrange multiplier of the
proof's Lagrangian; with that λ, V* = λ*² B (Theorem 1's text says "V* = λ* B", which is
the Lagrangian multiplier's form).

Everything here is pure Python (stdlib only) and deterministic.
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vllm_rl.control.checks import check_int as _check_int
from vllm_rl.control.checks import check_real as _check_real
from vllm_rl.control.checks import check_same_length as _check_same_length

__all__ = [
    "ABORTED", "EPS_KEPT", "KEPT", "STATUSES",
    "Allocation", "DuetController",
    "abort_propensity", "status_of", "allocate", "allocation_cost", "allocation_variance",
    "eq4_count", "loss_weight", "loss_weights", "neyman_allocation", "neyman_lambda",
    "neyman_variance", "percentile", "sigma_obs", "stratification_factors",
]

# Rollout outcomes as the engine reports them (Alg. A.10 lines 15-32).
KEPT = "kept"          # ended on its own or tail-trimmed after a marker: p_abort = 1
EPS_KEPT = "eps_kept"  # no marker by K2 + G, the ε-coin said keep: ran on, p_abort = ε
ABORTED = "aborted"    # no marker by K2 + G, the ε-coin said abort: I_abort = 1, masked out
STATUSES = (KEPT, EPS_KEPT, ABORTED)

# Defaults from App. A.3 (s_floor, ε_pre, 5th percentile) and Table 3 (ε_abort).
S_FLOOR = 0.01
FLOOR_PERCENTILE = 5.0
EPS_PRE = 0.05
EPS_ABORT = 0.05
N_MIN = 2
_MAX_EXPANSIONS = 4096


# ------------------------------------------------------------------------ input checks


def _check_unit(name: str, value: Any) -> float:
    """A probability-like floor in (0, 1]."""
    value = _check_real(name, value, lo=0.0, strict=True)
    if value > 1.0:
        raise ValueError(f"{name} must be in (0, 1], got {value}")
    return value


def _check_reals(name: str, values: Iterable[Any], lo: float | None = None,
                 strict: bool = False) -> list[float]:
    return [_check_real(f"{name}[{i}]", v, lo, strict) for i, v in enumerate(values)]


def _check_status(name: str, status: Any) -> str:
    if status not in STATUSES:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, STATUSES))}, "
                         f"got {status!r}")
    return status


def _check_n_max(n_max: Any, n_min: int) -> int | None:
    return None if n_max is None else _check_int("n_max", n_max, n_min)


# --------------------------------------------------------- Theorem 1: continuous optimum


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


# -------------------------------------------------------- Eq. 4: the integer allocation


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


# ----------------------------------------------------------- Eq. 3: the running surrogate


def sigma_obs(advantages: Sequence[float], seq_logprobs: Sequence[float],
              ddof: int = 1) -> float | None:
    """Eq. 3: σ̂_{q,t}^obs = std_i(A_{q,i} · Σ_ℓ log π_θt(y_{q,i,ℓ} | q, y_{q,i,<ℓ})).

    Pass the kept-not-aborted rollouts of one prompt (ε-kept ones included, unweighted):
    their advantages (GRPO, computed over all n_q rollouts, Alg. A.10 line 38) and their
    sequence log-probabilities under the policy that generated them.  The product is a
    scalar stand-in for the per-rollout gradient contribution Z_{q,i} = A ∇ log π.
    ``None`` with fewer than 2 rollouts (App. A.3: n_q = 1 defers to the next
    appearance).  The paper does not say which std; ``ddof=1`` (the sample std,
    ``torch.std``'s default) is the default, ``ddof=0`` gives the population std.
    """
    advantages = _check_reals("advantages", advantages)
    seq_logprobs = _check_reals("seq_logprobs", seq_logprobs)
    _check_same_length(advantages=advantages, seq_logprobs=seq_logprobs)
    if ddof not in (0, 1):
        raise ValueError(f"ddof must be 0 or 1, got {ddof!r}")
    if len(advantages) < 2:
        return None
    products = [a * lp for a, lp in zip(advantages, seq_logprobs)]
    return statistics.stdev(products) if ddof == 1 else statistics.pstdev(products)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile with linear interpolation between order statistics
    (position q/100 · (n − 1), numpy's default)."""
    ordered = sorted(_check_reals("values", values))
    if not ordered:
        raise ValueError("values must not be empty")
    q = _check_real("q", q, lo=0.0)
    if q > 100.0:
        raise ValueError(f"q must be in [0, 100], got {q}")
    pos = q / 100.0 * (len(ordered) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


# ------------------------------------------------------------------- Eq. 6: loss weights


def stratification_factors(counts: Sequence[int], eps_pre: float = EPS_PRE) -> list[float]:
    """Sec. 3.3 / Alg. A.10 line 9: s_q^pre = clip(n_q / n̄_t, ε_pre, 1), n̄_t = M⁻¹ Σ_q n_q.

    A stratification factor, not a sampling propensity (A5): prompts given fewer
    rollouts than the batch mean are up-weighted by 1/s_pre in Eq. 6, at most 1/ε_pre.
    """
    counts = [_check_int(f"counts[{i}]", n, 1) for i, n in enumerate(counts)]
    if not counts:
        raise ValueError("counts must not be empty")
    eps_pre = _check_unit("eps_pre", eps_pre)
    mean = math.fsum(counts) / len(counts)
    return [min(1.0, max(eps_pre, n / mean)) for n in counts]


def status_of(info) -> str:
    """The DUET status of a sample from its engine record (:class:`vllm_rl.RolloutInfo`)."""
    from vllm_rl.outcome import Reason

    if info.reason is Reason.DUET_ABORTED:
        return ABORTED
    if info.keep_prob is not None and info.keep_prob < 1.0:
        return EPS_KEPT
    return KEPT


def abort_propensity(status: str, eps_abort: float = EPS_ABORT) -> float:
    """p_{q,i}^abort of Sec. 3.2 / Alg. A.10 line 32: ε_abort once the keep coin was
    drawn (no marker by K2 + G: :data:`EPS_KEPT` or :data:`ABORTED`), else 1."""
    _check_status("status", status)
    eps_abort = _check_unit("eps_abort", eps_abort)
    return 1.0 if status == KEPT else eps_abort


def loss_weight(s_pre: float, status: str, eps_abort: float = EPS_ABORT) -> float:
    """Eq. 6's w_{q,i} = (1 − I_{q,i}^abort) / (s_q^pre · p_{q,i}^abort).

    1/s_pre for a :data:`KEPT` rollout, 1/(s_pre ε_abort) for an :data:`EPS_KEPT` one,
    0 for an :data:`ABORTED` one.
    """
    s_pre = _check_unit("s_pre", s_pre)
    p = abort_propensity(status, eps_abort)
    return 0.0 if status == ABORTED else 1.0 / (s_pre * p)


def loss_weights(counts: Mapping[Hashable, int], statuses: Mapping[Hashable, Sequence[str]],
                 eps_pre: float = EPS_PRE,
                 eps_abort: float = EPS_ABORT) -> dict[Hashable, list[float]]:
    """Eq. 6's per-rollout weights w_{q,i}, ready for the GRPO loss.

    ``counts`` is the step's allocation {q: n_q} (all M prompts: n̄_t averages over
    them), ``statuses`` the outcome of each of q's n_q rollouts.  The loss is then

        L_t(θ) = −(1/N_t) Σ_{q,i,ℓ} w_{q,i} A_{q,i} log π_θ(y_{q,i,ℓ} | q, y_{q,i,<ℓ}) m_{q,i,ℓ}

    with A_{q,i} the GRPO advantages over all n_q rollouts (aborted ones included, then
    zeroed: Alg. A.10 lines 38-41), m the post-abort response mask (all 0 for an aborted
    rollout) and N_t = Σ m the number of kept tokens (token-mean, line 43).
    """
    ids = list(counts)
    if set(statuses) != set(ids):
        missing = sorted(map(repr, set(ids) - set(statuses)))
        extra = sorted(map(repr, set(statuses) - set(ids)))
        raise ValueError(f"statuses must have exactly the prompts of counts "
                         f"(missing {missing}, extra {extra})")
    for q in ids:
        _check_int(f"counts[{q!r}]", counts[q], 1)
    factors = stratification_factors([counts[q] for q in ids], eps_pre)
    out: dict[Hashable, list[float]] = {}
    for q, s_pre in zip(ids, factors):
        row = list(statuses[q])
        if len(row) != counts[q]:
            raise ValueError(f"statuses[{q!r}] must have counts[{q!r}] = {counts[q]} "
                             f"entries, got {len(row)}")
        out[q] = [loss_weight(s_pre, _check_status(f"statuses[{q!r}][{i}]", st), eps_abort)
                  for i, st in enumerate(row)]
    return out


# -------------------------------------------------------------------------- controller


class DuetController:
    """DUET's trainer-side state: ŝ_q, L̂_q, s_floor and λ*_{t−1} (Alg. A.10 Phases 1, 4).

    * ŝ_q = max(s_floor, σ̂_q^obs) (Sec. 3.1): σ̂_q^obs is the plain running mean over
      q's appearances of Eq. 3's within-step σ̂_{q,t}^obs (line 48:
      σ̂ ← k/(k+1) σ̂ + 1/(k+1) σ̂_t), updated only when q had ≥ 2 kept-not-aborted
      rollouts.  It is used as soon as it has one observation (k_warmup = 1, App. A.5);
      a prompt without one gets s_floor (line 4).
    * s_floor (App. A.3): ``s_floor`` (0.01) until :meth:`end_epoch` is first called,
      then the ``floor_percentile``-th (5th) percentile of σ̂_q^obs over the prompts
      observed so far, frozen for the rest of the run.  If that percentile is 0 (over
      5% of prompts had degenerate groups) the floor stays where it was, since ŝ_q must
      stay positive (Theorem 2 needs s_floor > 0).
    * L̂_q (Sec. 3.1, line 51): the running mean of the lengths of all of q's kept-not-
      aborted rollouts so far, each rollout counted once (a marker rollout's length
      is its trimmed length, an ε-kept one's its natural length).  Cold start (the
      paper gives none): the running mean of all kept lengths seen so far, over all
      prompts, and ``initial_length`` before any step has been observed.  A cold batch
      then gets a uniform allocation, as in Fig. 4(b).
    * λ*: every :meth:`allocate` warm-starts at the previous step's λ* (line 56).

    ``n_min`` defaults to 2, not 1: a GRPO group of one rollout has zero advantage,
    and a prompt held at one rollout never yields Eq. 3's estimate (it needs ≥ 2), so
    its ŝ_q could never rise again.  The paper gives no value (Fig. 4(b) shows counts
    down to 1).  ``n_max`` optionally caps n_q (the engine accepts up to
    ``vllm_rl.flags.MAX_GROUP``).
    """

    def __init__(self, initial_length: float, *, n_min: int = N_MIN, n_max: int | None = None,
                 s_floor: float = S_FLOOR, floor_percentile: float = FLOOR_PERCENTILE,
                 eps_pre: float = EPS_PRE, eps_abort: float = EPS_ABORT, ddof: int = 1,
                 cap: bool = False, max_iter: int = 10) -> None:
        self.initial_length = _check_real("initial_length", initial_length, lo=0.0, strict=True)
        self.n_min = _check_int("n_min", n_min, 1)
        self.n_max = _check_n_max(n_max, self.n_min)
        self.s_floor = _check_real("s_floor", s_floor, lo=0.0, strict=True)
        self.floor_percentile = _check_real("floor_percentile", floor_percentile, lo=0.0)
        if self.floor_percentile > 100.0:
            raise ValueError(f"floor_percentile must be in [0, 100], got {floor_percentile}")
        self.eps_pre = _check_unit("eps_pre", eps_pre)
        self.eps_abort = _check_unit("eps_abort", eps_abort)
        if ddof not in (0, 1):
            raise ValueError(f"ddof must be 0 or 1, got {ddof!r}")
        self.ddof = ddof
        if not isinstance(cap, bool):
            raise ValueError(f"cap must be a bool, got {type(cap).__name__}")
        self.cap = cap
        self.max_iter = _check_int("max_iter", max_iter, 0)
        self.floor_frozen = False
        self.lam: float | None = None
        self.counts: dict[Hashable, int] = {}
        self.last: Allocation | None = None
        self._sigma: dict[Hashable, tuple[float, int]] = {}    # running mean, k_q
        self._length: dict[Hashable, tuple[float, int]] = {}   # running mean, rollouts
        self._all_length: tuple[float, int] = (0.0, 0)

    # ------------------------------------------------------------------ estimates

    def sigma_obs(self, prompt_id: Hashable) -> float | None:
        """σ̂_q^obs, the running mean of Eq. 3, or ``None`` before q's first estimate."""
        entry = self._sigma.get(prompt_id)
        return None if entry is None else entry[0]

    def observations(self, prompt_id: Hashable) -> int:
        """k_q: how many within-step estimates σ̂_q^obs averages."""
        entry = self._sigma.get(prompt_id)
        return 0 if entry is None else entry[1]

    def score(self, prompt_id: Hashable) -> float:
        """ŝ_q = max(s_floor, σ̂_q^obs) (Sec. 3.1; Alg. A.10 line 4), s_floor when cold."""
        sigma = self.sigma_obs(prompt_id)
        return self.s_floor if sigma is None else max(self.s_floor, sigma)

    def length(self, prompt_id: Hashable) -> float:
        """L̂_q: the running mean of q's kept rollout lengths (cold: see the class doc)."""
        entry = self._length.get(prompt_id)
        if entry is not None:
            return entry[0]
        mean, count = self._all_length
        return mean if count else self.initial_length

    # ------------------------------------------------------------------ the step

    def allocate(self, prompt_ids: Sequence[Hashable], budget: float) -> dict[Hashable, int]:
        """Phase 1 (Alg. A.10 lines 3-10): {q: n_q} for the batch by :func:`allocate`.

        Warm-started at the previous λ*; the new λ* and the result are kept
        (:attr:`lam`, :attr:`counts`, :attr:`last`) for :meth:`loss_weights` and the
        next step.
        """
        ids = list(prompt_ids)
        if not ids:
            raise ValueError("prompt_ids must not be empty")
        if len(set(ids)) != len(ids):
            raise ValueError("prompt_ids must not repeat a prompt")
        result = allocate([self.score(q) for q in ids], [self.length(q) for q in ids],
                          budget, self.n_min, self.n_max, self.lam, self.cap, self.max_iter)
        self.last = result
        self.lam = result.lam
        self.counts = dict(zip(ids, result.counts))
        return dict(self.counts)

    def stratification(self, counts: Mapping[Hashable, int] | None = None
                       ) -> dict[Hashable, float]:
        """{q: s_q^pre} (Alg. A.10 line 9) of ``counts`` (default: the last allocation)."""
        counts = self._counts(counts)
        return dict(zip(counts, stratification_factors(list(counts.values()), self.eps_pre)))

    def loss_weights(self, statuses: Mapping[Hashable, Sequence[str]],
                     counts: Mapping[Hashable, int] | None = None) -> dict[Hashable, list[float]]:
        """Eq. 6's w_{q,i} for each rollout (:func:`loss_weights`), by default against
        the last allocation."""
        return loss_weights(self._counts(counts), statuses, self.eps_pre, self.eps_abort)

    def observe(self, prompt_id: Hashable, advantages: Sequence[float],
                seq_logprobs: Sequence[float], lengths: Sequence[float],
                statuses: Sequence[str] | None = None) -> float | None:
        """Phase 4 (Alg. A.10 lines 46-52) for one prompt after the step.

        Call it once per prompt per step (each call is one appearance k_q of line 48).
        Pass all of q's rollouts (``statuses`` default: all :data:`KEPT`); the aborted
        ones are left out.  ``seq_logprobs`` are Σ_ℓ log π_θt over each rollout's
        tokens.  The kept ones update L̂_q (and the pooled cold-start mean) and, if there
        are ≥ 2 of them, σ̂_q^obs.  Returns this step's σ̂_{q,t}^obs (Eq. 3) or ``None``.
        """
        advantages = _check_reals("advantages", advantages)
        seq_logprobs = _check_reals("seq_logprobs", seq_logprobs)
        lengths = _check_reals("lengths", lengths, lo=0.0)
        if statuses is None:
            statuses = [KEPT] * len(advantages)
        statuses = [_check_status(f"statuses[{i}]", s) for i, s in enumerate(statuses)]
        _check_same_length(advantages=advantages, seq_logprobs=seq_logprobs,
                           lengths=lengths, statuses=statuses)
        kept = [i for i, s in enumerate(statuses) if s != ABORTED]
        estimate = sigma_obs([advantages[i] for i in kept], [seq_logprobs[i] for i in kept],
                             self.ddof)
        if estimate is not None:
            mean, k = self._sigma.get(prompt_id, (0.0, 0))
            self._sigma[prompt_id] = (k / (k + 1) * mean + estimate / (k + 1), k + 1)
        for i in kept:
            self._length[prompt_id] = _mean_step(self._length.get(prompt_id), lengths[i])
            self._all_length = _mean_step(self._all_length, lengths[i])
        return estimate

    def end_epoch(self) -> float:
        """Freeze s_floor at the 5th percentile of σ̂_q^obs across prompts (App. A.3).

        Only the first call that finds an observed prompt with a positive percentile
        changes the floor; later calls return it unchanged.
        """
        if not self.floor_frozen and self._sigma:
            value = percentile([m for m, _ in self._sigma.values()], self.floor_percentile)
            if value > 0.0:
                self.s_floor = value
                self.floor_frozen = True
        return self.s_floor

    # ------------------------------------------------------------------ persistence

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready snapshot of the running state (not the last allocation)."""
        config = {name: getattr(self, name) for name in (
            "initial_length", "n_min", "n_max", "s_floor", "floor_percentile", "eps_pre",
            "eps_abort", "ddof", "cap", "max_iter")}
        prompts = list(self._sigma) + [p for p in self._length if p not in self._sigma]
        return {
            **config,
            "floor_frozen": self.floor_frozen,
            "lam": self.lam,
            "all_length": list(self._all_length),
            "prompts": [[pid, *self._sigma.get(pid, (None, 0)),
                         *self._length.get(pid, (None, 0))] for pid in prompts],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DuetController:
        """Inverse of :meth:`to_dict`."""
        duet = cls(data["initial_length"], n_min=data["n_min"], n_max=data["n_max"],
                   s_floor=data["s_floor"], floor_percentile=data["floor_percentile"],
                   eps_pre=data["eps_pre"], eps_abort=data["eps_abort"], ddof=data["ddof"],
                   cap=data["cap"], max_iter=data["max_iter"])
        duet.floor_frozen = bool(data["floor_frozen"])
        lam = data["lam"]
        duet.lam = None if lam is None else _check_real("lam", lam, lo=0.0, strict=True)
        mean, count = data["all_length"]
        duet._all_length = (_check_real("all_length", mean, lo=0.0), _check_int("count", count, 0))
        for pid, sigma, k, length, n in data["prompts"]:
            if k:
                duet._sigma[pid] = (_check_real("sigma", sigma, lo=0.0), _check_int("k", k, 1))
            if n:
                duet._length[pid] = (_check_real("length", length, lo=0.0),
                                     _check_int("n", n, 1))
        return duet

    def _counts(self, counts: Mapping[Hashable, int] | None) -> Mapping[Hashable, int]:
        if counts is None:
            if not self.counts:
                raise ValueError("counts must be given before the first allocate()")
            return self.counts
        if not counts:
            raise ValueError("counts must not be empty")
        return counts


def _mean_step(entry: tuple[float, int] | None, value: float) -> tuple[float, int]:
    """One step of a running mean stored as (mean, count)."""
    mean, count = entry if entry is not None else (0.0, 0)
    return mean + (value - mean) / (count + 1), count + 1
