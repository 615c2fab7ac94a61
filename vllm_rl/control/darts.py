"""DARTS on the trainer side: how many samples each prompt gets and which ones it keeps.

Each step the trainer (DARTS paper, Sec. 4.2-4.3.1, App. A-D):

1. sets the total redundancy budget from the dataset-level length statistics and the
   rollout cost model (App. B, Eq. 8-9): :func:`adaptive_budget`;
2. splits it over the batch by each prompt's smoothed length std (Eq. 5 / 10,
   Alg. 1): :func:`allocate`;
3. picks each prompt's sampling mode (Alg. 2, line 3): shortest-only with proactive
   early stop when the prompt's budget saturates at ``M_up = 2M``, else dual-end.

:func:`plan` does the three and returns one :class:`PromptPlan` per prompt; its
:meth:`PromptPlan.rl_params` is the ``extra_args`` of the request carrying the group::

    stats = LengthStats()
    ptl = PTLCurve.from_points(profiled)          # App. A: once per model / TP setting
    k = cost_slope(ptl, recent_lengths, M, N)     # Eq. 6: refresh when lengths drift
    for each step:
        plans = plan(prompt_ids, stats, M, lam, k)
        params = [SamplingParams(n=p.n, extra_args=p.rl_params()) for p in plans]
        ...generate...
        for prompt_id, lengths in lengths_by_prompt.items():
            stats.update(prompt_id, lengths)
        stats.end_step()

The cost model is :class:`PTLCurve` (App. A) with :func:`rollout_cost` (Eq. 4).
Everything here is pure Python (stdlib only) and deterministic.
"""
from __future__ import annotations

import heapq
import math
import statistics
from bisect import bisect_right
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vllm_rl.control.checks import check_int as _check_int
from vllm_rl.control.checks import check_real as _check_real
from vllm_rl.flags import rl_params as _rl_params

__all__ = [
    "LengthStats", "PromptPlan", "PTLCurve", "adaptive_budget", "allocate",
    "allocation_objective", "cost_line", "cost_slope", "ema", "lambda_for_budget",
    "length_quantiles", "marginal_gain", "minmax_norm", "optimal_budget", "plan",
    "rollout_cost", "sampling_mode",
]

DUAL_END = "dual_end"
SHORTEST = "shortest"


# ------------------------------------------------------------------------ input checks


def _check_lengths(name: str, lengths: Iterable[float]) -> list[float]:
    values = list(lengths)
    for i, v in enumerate(values):
        _check_real(f"{name}[{i}]", v, lo=0.0)
    return [float(v) for v in values]


def _check_decay(name: str, value: Any) -> float:
    decay = _check_real(name, value, lo=0.0)
    if decay >= 1.0:
        raise ValueError(f"{name} must be in [0, 1), got {value}")
    return decay


# ------------------------------------------------------------------- length statistics


def ema(previous: float | None, value: float, decay: float) -> float:
    """One exponential-moving-average step: ``decay * previous + (1 - decay) * value``.

    The first value seeds the average (``previous is None``), so it is not biased to 0.
    """
    return value if previous is None else decay * previous + (1.0 - decay) * value


class LengthStats:
    """Smoothed response-length statistics (Sec. 4.2.2, App. B, App. C).

    * Per prompt: the EMA of the (population) variance of the lengths of its samples,
      the smoothed historical variance σ̃²_L(q_i) of Sec. 4.2.2 / App. C; it changes
      only when that prompt is rolled out again.
    * Dataset level: EMAs of the mean L̃ and of the std σ̃_L of all the lengths of a
      step (pooled over its prompts), which give ρ = σ̃_L / L̃ (App. B, Eq. 7).

    :meth:`update` records one prompt's lengths; :meth:`end_step` folds the step's
    pooled lengths into the dataset-level EMAs.  Reading a dataset-level value
    (:meth:`rho`, :attr:`mean`, :attr:`dataset_std`, or :meth:`std` of an unseen
    prompt) folds any pending lengths in first, so calling :meth:`update` for every
    prompt of a step and then planning the next step is enough.

    The paper gives no EMA decay.  Defaults: ``prompt_decay=0.5`` (a prompt returns
    only once per epoch, after the policy has moved a lot, so its latest rollout counts
    half) and ``dataset_decay=0.9`` (updated every step: a horizon of about 10 steps).
    """

    def __init__(self, prompt_decay: float = 0.5, dataset_decay: float = 0.9) -> None:
        self.prompt_decay = _check_decay("prompt_decay", prompt_decay)
        self.dataset_decay = _check_decay("dataset_decay", dataset_decay)
        self._variance: dict[Hashable, float] = {}
        self._mean: float | None = None
        self._std: float | None = None
        self._pending: list[float] = []

    def __contains__(self, prompt_id: Hashable) -> bool:
        return prompt_id in self._variance

    def __len__(self) -> int:
        return len(self._variance)

    def update(self, prompt_id: Hashable, lengths: Iterable[float]) -> None:
        """Record the lengths (tokens) of the samples one prompt got this step.

        Pass all M'_i of them (σ²({l_i^1, ..., l_i^M'_i}) of Sec. 4.2.2).  For a group
        stopped early (Alg. 2, line 12) the cancelled samples' lengths so far are lower
        bounds, so the estimate for such a prompt is biased low.
        """
        values = _check_lengths("lengths", lengths)
        if not values:
            raise ValueError("lengths must not be empty")
        variance = statistics.pvariance(values)
        self._variance[prompt_id] = ema(self._variance.get(prompt_id), variance,
                                        self.prompt_decay)
        self._pending.extend(values)

    def end_step(self) -> None:
        """Fold the step's pooled lengths into L̃ and σ̃_L (a no-op if none are pending)."""
        if not self._pending:
            return
        self._mean = ema(self._mean, statistics.fmean(self._pending), self.dataset_decay)
        self._std = ema(self._std, statistics.pstdev(self._pending), self.dataset_decay)
        self._pending = []

    def update_step(self, lengths_by_prompt: Mapping[Hashable, Iterable[float]]) -> None:
        """:meth:`update` every prompt of a step, then :meth:`end_step`."""
        for prompt_id, lengths in lengths_by_prompt.items():
            self.update(prompt_id, lengths)
        self.end_step()

    def variance(self, prompt_id: Hashable) -> float | None:
        """σ̃²_L(q_i), or ``None`` for a prompt never rolled out."""
        return self._variance.get(prompt_id)

    def std(self, prompt_id: Hashable) -> float:
        """σ̃_L(q_i) = sqrt(σ̃²_L(q_i)), the allocation signal of Eq. 5 / Alg. 1.

        Cold start: a prompt never rolled out gets the dataset-level σ̃_L (0.0 before
        the first step), i.e. it is treated as a typical draw from the dataset.
        """
        variance = self._variance.get(prompt_id)
        return self.dataset_std if variance is None else math.sqrt(variance)

    @property
    def mean(self) -> float:
        """L̃, the dataset-level EMA of the mean length (0.0 before the first step)."""
        self.end_step()
        return 0.0 if self._mean is None else self._mean

    @property
    def dataset_std(self) -> float:
        """σ̃_L, the dataset-level EMA of the length std (0.0 before the first step)."""
        self.end_step()
        return 0.0 if self._std is None else self._std

    def rho(self) -> float:
        """ρ = σ̃_L / L̃ (App. B, Eq. 7); 0.0 while there is no history (L̃ = 0)."""
        mean = self.mean
        return 0.0 if mean <= 0.0 else self.dataset_std / mean

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready snapshot (pending lengths are folded in first)."""
        self.end_step()
        return {
            "prompt_decay": self.prompt_decay,
            "dataset_decay": self.dataset_decay,
            "mean": self._mean,
            "std": self._std,
            "prompts": [[pid, var] for pid, var in self._variance.items()],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LengthStats:
        """Inverse of :meth:`to_dict`."""
        stats = cls(data["prompt_decay"], data["dataset_decay"])
        for name in ("mean", "std"):
            value = data[name]
            setattr(stats, f"_{name}", None if value is None else _check_real(name, value, 0.0))
        for pid, var in data["prompts"]:
            stats._variance[pid] = _check_real("variance", var, lo=0.0)
        return stats


# ----------------------------------------------------------------- redundancy budget


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


# ------------------------------------------------------------- redundancy allocation


def minmax_norm(values: Sequence[float]) -> list[float]:
    """Norm(·) of Eq. 5: min-max normalization over the batch; all 1.0 if all equal."""
    if not values:
        return []
    lo, hi = min(values), max(values)
    if hi == lo:
        return [1.0] * len(values)
    return [(v - lo) / (hi - lo) for v in values]


def marginal_gain(weight: float, m: int) -> float:
    """Alg. 1, line 4: Δ = w (1/M' − 1/(M'+1)), computed as w / (M' (M'+1))."""
    return weight / (m * (m + 1))


def allocation_objective(weights: Sequence[float], allocation: Sequence[int]) -> float:
    """The objective of Eq. 5 / 10: Σ_i w_i / M'_i."""
    return sum(w / m for w, m in zip(weights, allocation))


def allocate(stds: Sequence[float], M_total: int, M_low: int, M_up: int) -> list[int]:
    """Alg. 1: split ``M_total`` samples over the batch, minimizing Eq. 5 / 10.

    Weights are w_i = Norm(σ̃_L(q_i)) (:func:`minmax_norm`).  Every prompt starts at
    ``M_low``; each remaining unit goes to the prompt below ``M_up`` with the largest
    marginal gain Δ_i (ties: the lower index).  A max-heap keyed by (−Δ_i, i) makes it
    O(N log N + (M_total − N·M_low) log N).  The objective is separable and convex in
    each M'_i, so this greedy choice is optimal.
    """
    stds = [_check_real(f"stds[{i}]", s, lo=0.0) for i, s in enumerate(stds)]
    M_low = _check_int("M_low", M_low, 1)
    M_up = _check_int("M_up", M_up, M_low)
    M_total = _check_int("M_total", M_total, 0)
    n = len(stds)
    if not n * M_low <= M_total <= n * M_up:
        raise ValueError(f"M_total must be in [N*M_low, N*M_up] = [{n * M_low}, "
                         f"{n * M_up}] for N={n}, got {M_total}")
    weights = minmax_norm(stds)
    allocation = [M_low] * n
    heap = [(-marginal_gain(w, M_low), i) for i, w in enumerate(weights)] \
        if M_low < M_up else []
    heapq.heapify(heap)
    for _ in range(M_total - n * M_low):
        _, i = heapq.heappop(heap)
        allocation[i] += 1
        if allocation[i] < M_up:
            heapq.heappush(heap, (-marginal_gain(weights[i], allocation[i]), i))
    return allocation


# ------------------------------------------------------------------ per-prompt plans


def sampling_mode(redundant: int, m_up: int) -> str:
    """Alg. 2, line 3: dual-end while M'_i < M_up, else shortest-only + early stop."""
    return SHORTEST if redundant >= m_up else DUAL_END


@dataclass(frozen=True)
class PromptPlan:
    """One prompt's share of a step: ``n`` = M'_i samples, of which ``size`` = M kept.

    ``mode`` is ``"dual_end"`` (keep the ``k`` shortest and ``size - k`` longest valid
    samples, Alg. 2 lines 5-9) or ``"shortest"`` (keep the M shortest and stop the
    group once they have finished, Alg. 2 line 12).
    """

    prompt_id: Hashable
    n: int
    size: int
    mode: str
    k: int
    m_up: int

    @property
    def early_stop(self) -> bool:
        return self.mode == SHORTEST

    def rl_params(self, group_id: str | None = None) -> dict[str, Any]:
        """The ``SamplingParams.extra_args`` of this group, sent as one request with
        ``n = self.n``.  ``group_id`` is required only when the group is sent as
        ``n`` single-sample requests instead (they must share it); for one request
        the engine names the group itself.
        """
        group: dict[str, Any] = {"size": self.size, "redundant": self.n}
        if group_id is not None:
            group["id"] = group_id
        darts = {"mode": self.mode, "k": self.k, "m_up": self.m_up}
        return _rl_params(group=group, darts=darts)


def plan(prompt_ids: Sequence[Hashable], stats: LengthStats, M: int, lam: float,
         k_cost: float, K: int | None = None) -> list[PromptPlan]:
    """Plan one step: Eq. 9 budget, Alg. 1 allocation, Alg. 2 switch.

    ``M_low = M`` and ``M_up = 2M`` (the paper's setting); the budget is
    :func:`adaptive_budget` of ``stats.rho()``, ``lam`` and ``k_cost`` (Eq. 6's slope,
    see :func:`cost_slope`), and each prompt's weight comes from ``stats.std``.
    ``K`` is the dual-end short size, default ``M - 1`` (the paper's L = 1).
    """
    ids = list(prompt_ids)
    if not ids:
        raise ValueError("prompt_ids must not be empty")
    M = _check_int("M", M, 1)
    K = M - 1 if K is None else _check_int("K", K, 0)
    if K > M:
        raise ValueError(f"K must be in [0, M] = [0, {M}], got {K}")
    m_up = 2 * M
    total = adaptive_budget(stats.rho(), lam, k_cost, M, len(ids))
    allocation = allocate([stats.std(pid) for pid in ids], total, M, m_up)
    return [PromptPlan(pid, m, M, sampling_mode(m, m_up), K, m_up)
            for pid, m in zip(ids, allocation)]


# ------------------------------------------------------------------------ cost model


def _solve_tridiagonal(diag: Sequence[float], off: Sequence[float],
                       rhs: Sequence[float]) -> list[float] | None:
    """Solve a symmetric positive-definite tridiagonal system (Thomas algorithm).

    ``off[i]`` couples unknowns ``i`` and ``i + 1``.  ``None`` if a pivot vanishes
    (the system is singular: some knot value is not determined by the data).
    """
    n = len(diag)
    tol = 1e-12 * max(abs(d) for d in diag)
    c, r = [0.0] * n, [0.0] * n
    pivot = diag[0]
    for i in range(n):
        if i:
            pivot = diag[i] - off[i - 1] * c[i - 1]
        if pivot <= tol:
            return None
        c[i] = off[i] / pivot if i < n - 1 else 0.0
        r[i] = (rhs[i] - (off[i - 1] * r[i - 1] if i else 0.0)) / pivot
    x = [0.0] * n
    for i in range(n - 1, -1, -1):
        x[i] = r[i] - (c[i] * x[i + 1] if i < n - 1 else 0.0)
    return x


def _hat_row(x: float, knots: Sequence[float]) -> tuple[int, float]:
    """Segment ``s`` of ``x`` and its weight ``t``: f(x) = (1−t)·v_s + t·v_{s+1}."""
    s = 0 if x <= knots[1] else 1 if x <= knots[2] else 2
    return s, (x - knots[s]) / (knots[s + 1] - knots[s])


def _fit_values(xs: Sequence[float], ys: Sequence[float],
                knots: Sequence[float]) -> tuple[float, list[float]] | None:
    """Least-squares knot values of a continuous piecewise-linear fit; (SSE, values).

    The fit uses the hat (linear B-spline) basis, so the unknowns are the values at the
    knots and the normal matrix is well conditioned at any batch-size scale.
    """
    diag, off, rhs = [0.0] * 4, [0.0] * 3, [0.0] * 4
    rows = [_hat_row(x, knots) for x in xs]
    for (s, t), y in zip(rows, ys):
        u = 1.0 - t
        diag[s] += u * u
        off[s] += u * t
        diag[s + 1] += t * t
        rhs[s] += u * y
        rhs[s + 1] += t * y
    values = _solve_tridiagonal(diag, off, rhs)
    if values is None:
        return None
    sse = sum((y - (1.0 - t) * values[s] - t * values[s + 1]) ** 2
              for (s, t), y in zip(rows, ys))
    return sse, values


class _PrefixSums:
    """Prefix sums over points sorted by batch size: any fit's normal equations in O(1).

    For a segment [k, k + h] holding points ``lo:hi`` (t = (x − k)/h, u = 1 − t), the
    hat-basis sums Σu², Σut, Σt², Σuy, Σty follow from Σ1, Σx, Σx², Σy, Σxy.
    """

    def __init__(self, xs: Sequence[float], ys: Sequence[float]) -> None:
        pairs = sorted(zip(xs, ys))
        self.xs = [x for x, _ in pairs]
        self.syy = math.fsum(y * y for _, y in pairs)
        self.prefix = [(0.0, 0.0, 0.0, 0.0, 0.0)]
        for x, y in pairs:
            s0, s1, s2, sy, sxy = self.prefix[-1]
            self.prefix.append((s0 + 1, s1 + x, s2 + x * x, sy + y, sxy + x * y))

    def segment(self, lo: int, hi: int, k: float, h: float) -> tuple[float, ...]:
        """(Σu², Σut, Σt², Σuy, Σty) over points ``lo:hi`` of the segment [k, k + h]."""
        s0, s1, s2, sy, sxy = (b - a for a, b in zip(self.prefix[lo], self.prefix[hi]))
        st = (s1 - k * s0) / h
        stt = (s2 - 2 * k * s1 + k * k * s0) / (h * h)
        sty = (sxy - k * sy) / h
        return s0 - 2 * st + stt, st - stt, stt, sy - sty, sty

    def sse(self, knots: Sequence[float]) -> float | None:
        """Residual sum of squares of the least-squares fit with these knots."""
        x0, t1, t2, x1 = knots
        i1, i2 = bisect_right(self.xs, t1), bisect_right(self.xs, t2)
        segs = (self.segment(0, i1, x0, t1 - x0), self.segment(i1, i2, t1, t2 - t1),
                self.segment(i2, len(self.xs), t2, x1 - t2))
        diag, off, rhs = [0.0] * 4, [0.0] * 3, [0.0] * 4
        for s, (uu, ut, tt, uy, ty) in enumerate(segs):
            diag[s] += uu
            off[s] += ut
            diag[s + 1] += tt
            rhs[s] += uy
            rhs[s + 1] += ty
        values = _solve_tridiagonal(diag, off, rhs)
        if values is None:
            return None
        return max(0.0, self.syy - sum(v * r for v, r in zip(values, rhs)))


def _knot_candidates(distinct: Sequence[float], grid: int) -> list[float]:
    """Measured batch sizes and ``grid − 1`` evenly spaced points inside each interval,
    from the 2nd smallest to the 2nd largest (so two sizes lie outside each knot)."""
    inner = distinct[1:-1]
    points = {inner[0]}
    for x0, x1 in zip(inner, inner[1:]):
        points.update(x0 + (x1 - x0) * j / grid for j in range(1, grid + 1))
    return sorted(points)


@dataclass(frozen=True)
class PTLCurve:
    """Per-token latency vs batch size: a continuous three-piece linear fit (App. A).

    Stored as its four knots ``(x_min, t1, t2, x_max)`` — the measured range's ends
    and the two breakpoints — and the curve's values there.  Outside the measured
    range the end pieces extend linearly; the result is clamped at 0.  ``rmse`` is the
    fit's root-mean-square error on the profiled points.
    """

    knots: tuple[float, float, float, float]
    values: tuple[float, float, float, float]
    rmse: float = 0.0

    def __post_init__(self) -> None:
        knots = tuple(_check_real("knots", x) for x in self.knots)
        values = tuple(_check_real("values", y) for y in self.values)
        if len(knots) != 4 or len(values) != 4:
            raise ValueError("knots and values must have 4 entries each")
        if not all(a < b for a, b in zip(knots, knots[1:])):
            raise ValueError(f"knots must be strictly increasing, got {knots}")
        object.__setattr__(self, "knots", knots)
        object.__setattr__(self, "values", values)
        object.__setattr__(self, "rmse", _check_real("rmse", self.rmse, lo=0.0))

    @property
    def breakpoints(self) -> tuple[float, float]:
        return self.knots[1], self.knots[2]

    def __call__(self, bsz: float) -> float:
        """PTL(bsz) of Eq. 4."""
        s, t = _hat_row(float(bsz), self.knots)
        return max(0.0, (1.0 - t) * self.values[s] + t * self.values[s + 1])

    @classmethod
    def from_points(cls, points: Iterable[tuple[float, float]], grid: int = 16) -> PTLCurve:
        """Least-squares fit to profiled ``(batch_size, ptl)`` points (App. A).

        The two breakpoints are searched exhaustively over the measured batch sizes and
        a grid splitting each interval between them into ``grid`` equal parts
        (``grid=1``: measured sizes only); for each pair the knot values are the exact
        least-squares solution.  Each breakpoint keeps at least two distinct measured
        sizes on its outer side, so every candidate fit is determined; this needs at
        least four distinct batch sizes (repeated measurements of one size are fine).
        Cost: O(n log n + C²) with C ≈ grid · (distinct sizes − 3) candidates.
        """
        grid = _check_int("grid", grid, 1)
        pairs = [tuple(p) for p in points]
        if any(len(p) != 2 for p in pairs):
            raise ValueError("points must be (batch_size, ptl) pairs")
        xs = [_check_real(f"points[{i}] batch size", p[0], lo=0.0, strict=True)
              for i, p in enumerate(pairs)]
        ys = [_check_real(f"points[{i}] ptl", p[1], lo=0.0) for i, p in enumerate(pairs)]
        distinct = sorted(set(xs))
        if len(distinct) < 4:
            raise ValueError("points: a three-piece linear fit needs at least 4 distinct "
                             f"batch sizes, got {len(distinct)}")
        lo, hi = distinct[0], distinct[-1]
        sums = _PrefixSums(xs, ys)
        cands = _knot_candidates(distinct, grid)
        best: tuple[float, float, float] | None = None
        for i, t1 in enumerate(cands):
            for t2 in cands[i + 1:]:
                sse = sums.sse((lo, t1, t2, hi))
                if sse is not None and (best is None or sse < best[0]):
                    best = (sse, t1, t2)
        if best is None:
            raise ValueError("points: no well-determined three-piece fit")
        knots = (lo, best[1], best[2], hi)
        fit = _fit_values(xs, ys, knots)
        if fit is None:
            raise ValueError("points: no well-determined three-piece fit")
        sse, values = fit
        return cls(knots, tuple(values), math.sqrt(sse / len(xs)))

    def to_dict(self) -> dict[str, Any]:
        return {"knots": list(self.knots), "values": list(self.values), "rmse": self.rmse}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PTLCurve:
        return cls(tuple(data["knots"]), tuple(data["values"]), data.get("rmse", 0.0))


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
