"""How well a score ranks outcomes, and ARRoL's test-time voting (Sec. 4.4, Fig. 2).

:func:`spearman`, :func:`auc`, :func:`weighted_auc` and :func:`grouped_auc` (within
prompts) against correctness; :func:`steering_gain` (whether Eq. 2's steering brings
groups closer to ρ than random pruning at the same keep rate, Table 4: the pruning gate's
test) and :func:`balance_gain` (than keeping every sample);
:func:`trace_confidence` (the DeepConf-style baseline of Fig. 2); :func:`rank_weights` /
:func:`weighted_vote` (Sec. 4.4).
"""
from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from typing import Any
import numpy as np


def _ranks(x: Any) -> np.ndarray:
    """0-based ranks, ties given their average rank (multiples of 1/2, exact)."""
    a = np.asarray(x, dtype=np.float64).reshape(-1)
    order = np.argsort(a, kind="mergesort")
    ranks = np.empty(len(a))
    i = 0
    while i < len(a):
        j = i
        while j + 1 < len(a) and a[order[j + 1]] == a[order[i]]:
            j += 1
        ranks[order[i:j + 1]] = 0.5 * (i + j)
        i = j + 1
    return ranks


def _finite(name: str, x: Any) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64).reshape(-1)
    if not np.isfinite(a).all():
        raise ValueError(f"{name}: allowed finite numbers only")
    return a


def rank_weights(scores: Sequence[float]) -> list[float]:
    """Sec. 4.4: sort the candidates by score and rescale the ranks linearly to [0, 1]
    (lowest 0, highest 1, ties share their average rank; one candidate gets 1)."""
    s = _finite("scores", scores)
    if len(s) <= 1:
        return [1.0] * len(s)
    return (_ranks(s) / (len(s) - 1)).tolist()


def weighted_vote(answers: Sequence[Hashable], scores: Sequence[float]) -> Hashable:
    """Sec. 4.4: the answer with the largest sum of :func:`rank_weights` over its
    candidates; a tie between answers goes to the one that occurs first.  (Sums are
    compared on the unscaled average ranks, which are exact, so ties are exact.)"""
    s = _finite("scores", scores)
    if len(answers) != len(s):
        raise ValueError(f"scores: {len(s)} values for {len(answers)} answers")
    if not len(s):
        raise ValueError("weighted_vote: no candidates")
    ranks = _ranks(s) if len(s) > 1 else np.ones(1)
    totals: dict[Hashable, float] = {}
    for a, r in zip(answers, ranks):
        totals[a] = totals.get(a, 0.0) + float(r)
    best = max(totals.values())
    return next(a for a, t in totals.items() if t == best)


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rank correlation (Fig. 2(c)): Pearson's correlation of the average
    ranks (ties share their rank).  0.0 when it is undefined (fewer than 2 points or a
    constant side, e.g. a held-out set with one outcome)."""
    x, y = _finite("x", x), _finite("y", y)
    if len(x) != len(y):
        raise ValueError(f"y: {len(y)} values for {len(x)} in x")
    if len(x) < 2:
        return 0.0
    rx, ry = _ranks(x), _ranks(y)
    rx, ry = rx - rx.mean(), ry - ry.mean()
    den = math.sqrt(float((rx * rx).sum() * (ry * ry).sum()))
    return float((rx * ry).sum() / den) if den > 0 else 0.0


def auc(scores: Sequence[float], labels: Sequence[float]) -> float:
    """ROC AUC = P(score of a positive > score of a negative), a tie counted 1/2
    (Mann-Whitney U / (N⁺ N⁻) from the average ranks).  Labels are 0/1; 0.5 when one
    class is empty (undefined)."""
    s = _finite("scores", scores)
    y = np.asarray(labels, dtype=np.float64).reshape(-1)
    if len(y) != len(s):
        raise ValueError(f"labels: {len(y)} values for {len(s)} scores")
    if not np.isin(y, (0.0, 1.0)).all():
        raise ValueError("labels: allowed 0 or 1")
    pos = y == 1.0
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    if n_pos == 0 or n_neg == 0:
        return 0.5
    r = _ranks(s) + 1.0
    return float((r[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def trace_confidence(logprobs: Sequence[float]) -> float:
    """The DeepConf-style baseline of Fig. 2: mean token negative log-probability of the
    trace (lower = more confident).  Raises on an empty trace."""
    lp = _finite("logprobs", logprobs)
    if not len(lp):
        raise ValueError("trace_confidence: empty logprobs")
    return float(-lp.mean())


def weighted_auc(scores: Sequence[float], labels: Sequence[int],
                 weights: Sequence[float]) -> float:
    """P(score of a positive > score of a negative) with each pair weighted by the
    product of its weights (ties count 1/2); 0.5 when a class is empty."""
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(labels, dtype=bool)
    w = np.asarray(weights, dtype=np.float64)
    wp, wn = w[y].sum(), w[~y].sum()
    if wp <= 0 or wn <= 0:
        return 0.5
    order = np.argsort(s, kind="mergesort")
    s, y, w = s[order], y[order], w[order]
    total, neg_below, i = 0.0, 0.0, 0
    while i < len(s):
        j = i
        while j + 1 < len(s) and s[j + 1] == s[i]:
            j += 1
        pos = w[i:j + 1][y[i:j + 1]].sum()
        neg = w[i:j + 1][~y[i:j + 1]].sum()
        total += pos * (neg_below + 0.5 * neg)
        neg_below += neg
        i = j + 1
    return float(total / (wp * wn))


def grouped_auc(scores: Sequence[float], labels: Sequence[int], weights: Sequence[float],
                groups: Sequence[Hashable]) -> float | None:
    """The within-group AUC: P(score of a positive > score of a negative) over the pairs
    of the *same* group (prompt) only, each pair weighted by the product of its weights
    (ties count 1/2), pooled over groups by their pairs' weight.  Eq. 2 steers within a
    group, so this is the ranking it needs; an AUC over pairs across prompts also credits
    a head that only tells easy prompts from hard ones.  None when no group has both
    outcomes."""
    by: dict[Hashable, list[int]] = {}
    for i, g in enumerate(groups):
        by.setdefault(g, []).append(i)
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(labels, dtype=bool)
    w = np.asarray(weights, dtype=np.float64)
    num = den = 0.0
    for idx in by.values():
        i = np.asarray(idx)
        wp, wn = w[i][y[i]].sum(), w[i][~y[i]].sum()
        if wp <= 0 or wn <= 0:
            continue
        num += weighted_auc(s[i], y[i], w[i]) * wp * wn
        den += wp * wn
    return num / den if den > 0 else None



def _groups(survival, labels, weights, groups, name):
    """The samples of groups with at least two members, in group order: (p, y, w, group
    index, number of groups), or None."""
    p = np.clip(_finite("survival", survival), 0.0, 1.0)
    y = _finite("labels", labels)
    w = _finite("weights", weights)
    if not (len(p) == len(y) == len(w) == len(groups)):
        raise ValueError(f"{name}: survival, labels, weights and groups differ in length")
    index: dict[Hashable, list[int]] = {}
    for i, g in enumerate(groups):
        index.setdefault(g, []).append(i)
    members = [np.array(ix) for ix in index.values() if len(ix) >= 2]
    if not members:
        return None
    gid = np.concatenate([np.full(len(ix), k) for k, ix in enumerate(members)])
    order = np.concatenate(members)
    return p[order], y[order], w[order], gid, len(members)


def _distance(keep: np.ndarray, y: np.ndarray, w: np.ndarray, gid: np.ndarray, n: int,
              rho: float) -> np.ndarray:
    """Per group, E|ρ̂_g − ρ| over the draws of ``keep`` (draws × samples, 0/1): ρ̂_g =
    Σ c w y / Σ c w of the kept (0 where none is kept)."""
    kept = keep * w
    k_all = np.zeros((keep.shape[0], n))
    k_pos = np.zeros((keep.shape[0], n))
    np.add.at(k_all.T, gid, kept.T)
    np.add.at(k_pos.T, gid, (kept * y).T)
    share = np.divide(k_pos, k_all, out=np.zeros_like(k_pos), where=k_all > 0)
    return np.abs(share - rho).mean(axis=0)


def balance_gain(survival: Sequence[float], labels: Sequence[int],
                 weights: Sequence[float], groups: Sequence[Hashable], rho: float,
                 draws: int = 256, seed: int = 0) -> dict[str, float] | None:
    """How much closer to ρ ARRoL's coins bring the groups than keeping every sample.

    Each sample has its survival probability p (Eq. 2), its label y (reward > 0), its
    inverse-propensity weight w (it stands for w samples of the full group: 1/p where an
    earlier coin let it through) and its group.  Per group with at least two samples,
    stock's distance is |ρ_g − ρ| with ρ_g = Σ w y / Σ w, the group's share of correct
    samples, every sample kept; ARRoL's is E|ρ̂_g − ρ| over ``draws`` seeded draws of the
    coins (Alg. 1 l.19), ρ̂_g = Σ c w y / Σ c w of the kept (0 where none is kept).  The
    gain is the mean over groups of stock's distance minus ARRoL's.  Removing samples
    from a small group moves ρ̂_g away from ρ in expectation even at random, so this is
    no pruning gate (random halving fails it too); it is the measure of ``vllm-rl bench
    arrol-gate``.  The gate is :func:`steering_gain`.

    Returns ``{"gain", "stock", "steered", "groups"}``, or None with no group of two.
    """
    found = _groups(survival, labels, weights, groups, "balance_gain")
    if found is None:
        return None
    p, y, w, gid, n = found
    total = np.bincount(gid, weights=w, minlength=n)
    share = np.bincount(gid, weights=w * y, minlength=n) / np.where(total > 0, total, 1.0)
    stock = np.abs(share - rho)
    u = np.random.default_rng(seed).random((draws, len(p)))
    steered = _distance(u < p, y, w, gid, n, rho)
    return {"gain": float((stock - steered).mean()), "stock": float(stock.mean()),
            "steered": float(steered.mean()), "groups": float(n)}


def steering_gain(survival: Sequence[float], labels: Sequence[int],
                  weights: Sequence[float], groups: Sequence[Hashable], rho: float,
                  draws: int = 256, seed: int = 0) -> dict[str, float] | None:
    """How much closer to ρ Eq. 2's coins bring the groups than random pruning at the
    same keep rate: ARRoL's own comparison (Table 4, "Random" against ARRoL at one keep
    rate).

    Inputs as :func:`balance_gain`.  Steered: each sample kept with its p (Eq. 2);
    random: each kept with p̄ = Σ w p / Σ w, the same expected keep rate.  Both use the
    same ``draws`` seeded uniforms (common random numbers: sample i is kept when
    u_i < p_i, or u_i < p̄), so the difference is the steering's alone.  Per group with at
    least two samples, E|ρ̂_g − ρ| under each; the gain is the mean over groups of random's
    minus steered's: > 0 where the head's steering beats pruning at random, the test
    under which pruning is worth its samples; ``se`` is its standard error over the groups
    (a head that cannot rank gives p ≈ p̄ and a gain within noise of 0).

    Returns ``{"gain", "se", "random", "steered", "keep_rate", "groups"}``, or None with
    no group of two.
    """
    found = _groups(survival, labels, weights, groups, "steering_gain")
    if found is None:
        return None
    p, y, w, gid, n = found
    rate = float(np.sum(w * p) / np.sum(w)) if np.sum(w) > 0 else 0.0
    u = np.random.default_rng(seed).random((draws, len(p)))
    steered = _distance(u < p, y, w, gid, n, rho)
    random = _distance(u < rate, y, w, gid, n, rho)
    diff = random - steered
    se = float(diff.std(ddof=1) / math.sqrt(n)) if n > 1 else float("inf")
    return {"gain": float(diff.mean()), "se": se, "random": float(random.mean()),
            "steered": float(steered.mean()), "keep_rate": rate, "groups": float(n)}


__all__ = ["auc", "balance_gain", "grouped_auc", "rank_weights", "spearman", "steering_gain",
           "trace_confidence",
           "weighted_auc", "weighted_vote"]
