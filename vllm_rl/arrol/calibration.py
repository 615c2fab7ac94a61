"""ARRoL's calibration on the trainer side (App. A.4): the sliding buffer behind Eq. 1's
counts, the prior, δ solved so that E[p] = κ, and the cold start.

- :class:`CalibrationBuffer`: the last ``window`` (score, outcome) pairs;
  :meth:`~CalibrationBuffer.calibration` is the ``h_t`` of Alg. 1 l.3 that
  ``arrol_update(calibration=...)`` takes;
- :func:`solve_delta`: δ with E[p] = κ by bisection (App. A.4);
- :class:`ColdStart`: score and record, never prune, for the first steps (Sec. 5; Table 7).
"""
from __future__ import annotations

import math
import numbers
from collections import deque
from collections.abc import Sequence
import numpy as np
from vllm_rl.checks import check_unit as _check_unit
from vllm_rl.checks import is_int as _is_int
from vllm_rl.arrol.rule import (BINS, Calibration, bin_of, posterior)


def solve_delta(qs: Sequence[float], kappa: float, rho: float, lam: float, p_min: float,
                p_max: float, tol: float = 1e-9,
                weights: Sequence[float] | None = None) -> float:
    """δ with mean_i clip(κ + δ + λ(ρ − q_i), p_min, p_max) = κ, by bisection (App. A.4:
    "We solve for δ by binary search such that ... E[p_i] = κ"); the mean weighted by
    ``weights`` where given (a coin's survivor stands for 1/p samples).

    With a_i = κ + λ(ρ − q_i) the mean keep rate is continuous and non-decreasing in δ,
    from p_min at δ_lo = p_min − max a_i to p_max at δ_hi = p_max − min a_i; bisection on
    [δ_lo, δ_hi] stops when the bracket is narrower than ``tol`` (the mean is 1-Lipschitz
    in δ, so it is within ``tol``/2 of κ).  If κ is not attainable, i.e. κ > p_max (or
    κ < p_min), δ is clipped to the nearest end: δ_hi (every p = p_max) or δ_lo (every
    p = p_min).  Empty ``qs``: 0.
    """
    kappa, rho = _check_unit("kappa", kappa), _check_unit("rho", rho)
    p_min, p_max = _check_unit("p_min", p_min), _check_unit("p_max", p_max)
    if p_min > p_max:
        raise ValueError(f"p_min={p_min} > p_max={p_max}: allowed p_min <= p_max")
    if isinstance(lam, bool) or not isinstance(lam, numbers.Real) or not 0 <= lam < math.inf:
        raise ValueError(f"lam={lam!r}: allowed a finite float >= 0")
    if isinstance(tol, bool) or not isinstance(tol, numbers.Real) or not tol > 0:
        raise ValueError(f"tol={tol!r}: allowed a float > 0")
    q = np.asarray(qs, dtype=np.float64).reshape(-1)
    if q.size == 0:
        return 0.0
    if not np.isfinite(q).all():
        raise ValueError("qs: allowed finite posteriors only")
    a = kappa + lam * (rho - q)
    w = np.ones_like(q) if weights is None else np.asarray(weights, dtype=np.float64)
    if w.shape != q.shape or not np.isfinite(w).all() or (w < 0).any() or w.sum() <= 0:
        raise ValueError("weights: allowed one finite weight >= 0 per posterior, not all 0")
    w = w / w.sum()

    def mean_p(d: float) -> float:
        return float(np.dot(np.clip(a + d, p_min, p_max), w))

    lo, hi = p_min - float(a.max()), p_max - float(a.min())
    if mean_p(hi) <= kappa:
        return hi
    if mean_p(lo) >= kappa:
        return lo
    while hi - lo > tol:
        mid = 0.5 * (lo + hi)
        if mean_p(mid) < kappa:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


class CalibrationBuffer:
    """The sliding buffer of scored rollouts behind the calibration (Sec. 4.2, App. A.4).

    Holds the last ``window`` (score s' in [0, 1], outcome y in {0, 1}, weight w) triples,
    FIFO (default 2048; the paper does not give the window).  The scores are meant to be
    *out of sample*: the ones the engine recorded from the head version that scored each
    sample, before any head had trained on it (App. A.4 estimates the counts from
    earlier steps' rollouts; re-scoring the buffer with a head fitted on it would make q
    over-confident on fresh samples, so E[p] ≠ κ).  The weight is the sample's inverse
    propensity (1/p for a survivor of ARRoL's coin, 1/eps for one DUET's coin kept:
    :func:`vllm_rl.arrol.controller.label_weight`), so the survivors stand for the
    samples the coins removed.  Eq. 1's counts c_b^± are weighted histograms over
    ``bins`` uniform bins.  The prior π = P(Y = 1) is the buffer's weighted positive
    share with the same Laplace pseudo-count α as the likelihoods, one per class:
    π = (W⁺ + α) / (W + 2α), so it is in (0, 1) even for an empty or one-class buffer
    (:attr:`prior` is the α = 1 value).
    """

    def __init__(self, window: int = 2048, bins: int = BINS) -> None:
        if not _is_int(window) or window < 1:
            raise ValueError(f"CalibrationBuffer window={window!r}: allowed an int >= 1")
        if not _is_int(bins) or bins < 1:
            raise ValueError(f"CalibrationBuffer bins={bins!r}: allowed an int >= 1")
        self.bins = int(bins)
        self.window = int(window)
        self.items: deque[tuple[float, int, float]] = deque(maxlen=self.window)

    def __len__(self) -> int:
        return len(self.items)

    def add(self, scores: Sequence[float], labels: Sequence[float],
            weights: Sequence[float] | None = None) -> None:
        """Append scored rollouts (oldest drop out past ``window``).  Scores must be
        finite (clipped into [0, 1] when binned); labels 0/1 (or False/True); weights
        finite and > 0 (default 1)."""
        scores, labels = list(scores), list(labels)
        weights = [1.0] * len(scores) if weights is None else list(weights)
        if len(scores) != len(labels) or len(scores) != len(weights):
            raise ValueError(f"labels, weights: {len(labels)}, {len(weights)} values for "
                             f"{len(scores)} scores")
        new = []
        for i, (s, y, w) in enumerate(zip(scores, labels, weights)):
            s, w = float(s), float(w)
            if not math.isfinite(s):
                raise ValueError(f"scores[{i}]={s!r}: allowed a finite float in [0, 1]")
            if y not in (0, 1):
                raise ValueError(f"labels[{i}]={y!r}: allowed 0 or 1 (the binary reward)")
            if not (math.isfinite(w) and w > 0):
                raise ValueError(f"weights[{i}]={w!r}: allowed a finite float > 0")
            new.append((s, int(y), w))
        self.items.extend(new)

    def counts(self) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """Eq. 1, weighted: c_b^± = Σ {w_k : y_k = ±, b(s_k) = b} over the buffer."""
        pos, neg = [0.0] * self.bins, [0.0] * self.bins
        for s, y, w in self.items:
            (pos if y else neg)[bin_of(s, self.bins)] += w
        return tuple(pos), tuple(neg)

    def smoothed_prior(self, alpha: float = 1.0) -> float:
        """π = (W⁺ + α) / (W + 2α) over the buffer (W: summed weights)."""
        w_pos = sum(w for _, y, w in self.items if y)
        return (w_pos + alpha) / (sum(w for _, _, w in self.items) + 2 * alpha)

    @property
    def prior(self) -> float:
        """π with α = 1: (W⁺ + 1) / (W + 2)."""
        return self.smoothed_prior(1.0)

    def calibration(self, kappa: float = 0.5, rho: float = 0.5, lam: float = 0.5,
                    p_min: float = 0.1, p_max: float = 0.9, alpha: float = 1.0,
                    auc: float | None = None) -> Calibration:
        """The ``h_t`` of Alg. 1 l.3: Eq. 1's weighted counts, π (:meth:`smoothed_prior`
        with the same ``alpha``), and δ = :func:`solve_delta` over the posteriors of the
        buffer's scores, weighted, so the expected keep rate over the distribution the
        buffer stands for is κ (App. A.4).  The requests' ``arrol`` flags must carry the
        same κ, ρ, λ, p_min, p_max.  An empty buffer gives δ = 0 and π = 1/2 (every
        q = 1/2).  ``auc``: the head's held-out AUC the records will carry."""
        pos, neg = self.counts()
        prior = self.smoothed_prior(alpha)
        base = Calibration(pos, neg, alpha, prior, 0.0, self.bins)
        qs = [posterior(base, s) for s, _, _ in self.items]
        delta = solve_delta(qs, kappa, rho, lam, p_min, p_max,
                            weights=[w for _, _, w in self.items] if qs else None)
        return Calibration(pos, neg, alpha, prior, delta, self.bins, auc)


class ColdStart:
    """Score and record, never prune, for the first ``steps`` trainer steps (Sec. 5: "a
    cold-start period of 20 steps to initialize the quality head and the pruning
    estimator"; App. Table 7 varies it).  Call :meth:`tick` once per trainer step."""

    def __init__(self, steps: int = 20) -> None:
        if not _is_int(steps) or steps < 0:
            raise ValueError(f"ColdStart steps={steps!r}: allowed an int >= 0")
        self.steps = int(steps)
        self.done = 0

    def tick(self) -> None:
        self.done += 1

    @property
    def active(self) -> bool:
        return self.done < self.steps

    def calibration(self, source: "CalibrationBuffer | Calibration",
                    **flags: float) -> Calibration | None:
        """None while cold ("push no calibration": the engine only scores); afterwards
        ``source`` itself if it is a :class:`Calibration`, else
        ``source.calibration(**flags)`` of a :class:`CalibrationBuffer`."""
        if self.active:
            return None
        return source if isinstance(source, Calibration) else source.calibration(**flags)


__all__ = ["CalibrationBuffer", "ColdStart", "solve_delta"]
