"""How well a score ranks outcomes, and ARRoL's test-time voting (Sec. 4.4, Fig. 2).

:func:`spearman`, :func:`auc`, :func:`weighted_auc` and :func:`grouped_auc` (within
prompts) against correctness; :func:`balance_gain` (whether Eq. 2's steering brings groups
closer to ρ than keeping every sample: the pruning gate's test);
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
    gain is the mean over groups of stock's distance minus ARRoL's: > 0 where steering
    helps the balance the paper aims at (Sec. 4.2: "the kept rollouts have a controlled
    positive ratio close to ρ"), ≤ 0 where the groups are farther from ρ after pruning,
    as on groups that straddle ρ, since Eq. 2 with E[p] = κ prunes the likelier-correct
    harder (:func:`vllm_rl.arrol.rule.survival`) and every coin adds noise.  This is the
    measure of ``vllm-rl bench arrol-gate``, on a model's own recent groups.

    Returns ``{"gain", "stock", "steered", "groups"}``, or None with no group of two.
    """
    p = np.clip(_finite("survival", survival), 0.0, 1.0)
    y = _finite("labels", labels)
    w = _finite("weights", weights)
    if not (len(p) == len(y) == len(w) == len(groups)):
        raise ValueError("balance_gain: survival, labels, weights and groups differ in length")
    index: dict[Hashable, list[int]] = {}
    for i, g in enumerate(groups):
        index.setdefault(g, []).append(i)
    members = [np.array(ix) for ix in index.values() if len(ix) >= 2]
    if not members:
        return None
    gid = np.concatenate([np.full(len(ix), k) for k, ix in enumerate(members)])
    order = np.concatenate(members)
    p, y, w = p[order], y[order], w[order]
    n = len(members)
    total = np.bincount(gid, weights=w, minlength=n)
    share = np.bincount(gid, weights=w * y, minlength=n) / np.where(total > 0, total, 1.0)
    stock = np.abs(share - rho)
    rng = np.random.default_rng(seed)
    kept = (rng.random((draws, len(p))) < p) * w                     # (draws, samples)
    k_all = np.zeros((draws, n))
    k_pos = np.zeros((draws, n))
    np.add.at(k_all.T, gid, kept.T)
    np.add.at(k_pos.T, gid, (kept * y).T)
    kept_share = np.divide(k_pos, k_all, out=np.zeros_like(k_pos), where=k_all > 0)
    steered = np.abs(kept_share - rho).mean(axis=0)
    return {"gain": float((stock - steered).mean()), "stock": float(stock.mean()),
            "steered": float(steered.mean()), "groups": float(n)}


__all__ = ["auc", "balance_gain", "grouped_auc", "rank_weights", "spearman", "trace_confidence",
           "weighted_auc", "weighted_vote"]
