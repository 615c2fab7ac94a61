"""DAS's length-aware draft budget: how many draft tokens each request gets per step.

DAS (Shao, Srivatsa et al., Sec. 4.2) speeds up RL rollouts with speculative decoding
whose budget follows the request's expected length: the batch ends when its longest
request ends, so drafting pays on long requests and is wasted on short ones.  This
module is the policy half (pure Python, stdlib only; no vLLM, no torch); the engine's
drafter asks it for a budget every decode step.

* **Cost model** (Sec. 4.2.1).  A forward pass costs t_fwd = c_base + c_tok n_toks (Eq. 1)
  and a rollout c_base N_fwd + c_tok N_toks + C (Eq. 2).  Where drafting pays by batch
  size is :mod:`.batch_caps`.
* **Budget model** (Sec. 4.2.2).  A request of length l given p proposed tokens in all
  accepts A = k l (1 − e^{−αp/l}) of them (Eq. 3): :func:`accepted_tokens`; it still needs
  l − A passes (the term of Eq. 4): :func:`remaining_passes`; the batch's latency is
  Eq. 5: :func:`latency`.  Minimising it (Eq. 6) makes every active constraint tight and
  gives p*_i in closed form (Eq. 7): :func:`optimal_budget`, :func:`optimal_budgets`.
  :func:`step_budget` spreads a total over the passes; :func:`estimate_k_alpha` fits
  (k, α) to the counts the engine sees (:class:`AcceptanceEstimate`).
* **Length classes** (Sec. 4.2.3): :mod:`.length_classes`, which budget each request gets
  by its expected length.
"""
from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from vllm_rl.checks import check_int as _check_int
from vllm_rl.checks import check_real as _check_real
from vllm_rl.checks import check_unit as _check_unit
from vllm_rl.checks import check_same_length as _check_same_length

__all__ = [
    "AcceptanceEstimate",
    "accepted_tokens", "chain_acceptance", "estimate_k", "estimate_k_alpha",
    "estimate_k_many", "fit_alpha",
    "latency", "optimal_budget", "optimal_budgets", "remaining_passes", "step_budget",
]


K_MIN, K_MAX = 0.01, 0.99                # clamps of estimate_k_alpha
ALPHA_MIN, ALPHA_MAX = 0.05, 20.0


# ------------------------------------------------------------------------ input checks


def _check_model(p: Any, l: Any, k: Any, alpha: Any) -> tuple[float, float, float, float]:
    return (_check_real("p", p, lo=0.0), _check_real("l", l, lo=0.0), _check_unit("k", k),
            _check_real("alpha", alpha, lo=0.0, strict=True))


# ------------------------------------------------------ Sec. 4.2.2: the budget model


def accepted_tokens(p: float, l: float, k: float, alpha: float) -> float:
    """Eq. 3: A(p) = k l (1 − e^{−αp/l}), the accepted tokens of a request of length ``l``
    given ``p`` proposed tokens in all (0 for l = 0)."""
    p, l, k, alpha = _check_model(p, l, k, alpha)
    return 0.0 if l == 0.0 else -k * l * math.expm1(-alpha * p / l)


def remaining_passes(p: float, l: float, k: float, alpha: float) -> float:
    """l − A(p) = l (1 − k + k e^{−αp/l}), the forward passes one request needs: the term
    maximised in Eq. 4 (N_fwd = max_i of it)."""
    p, l, k, alpha = _check_model(p, l, k, alpha)
    return 0.0 if l == 0.0 else l * (1.0 - k + k * math.exp(-alpha * p / l))


def latency(p_list: Sequence[float], l_list: Sequence[float], k_list: Sequence[float],
            alpha_list: Sequence[float], c_base: float, c_tok: float, c: float = 0.0) -> float:
    """Eq. 5: J(p) = c_base max_i l_i (1 − k_i + k_i e^{−α_i p_i / l_i}) + c_tok Σ_i p_i + C
    (an empty batch costs C)."""
    _check_same_length(p_list=p_list, l_list=l_list, k_list=k_list, alpha_list=alpha_list)
    c_base = _check_real("c_base", c_base, lo=0.0)
    c_tok = _check_real("c_tok", c_tok, lo=0.0)
    c = _check_real("c", c, lo=0.0)
    passes = [remaining_passes(*args) for args in zip(p_list, l_list, k_list, alpha_list)]
    return c_base * max(passes, default=0.0) + c_tok * math.fsum(p_list) + c


def _eq7(l: float, k: float, alpha: float, n_fwd: float) -> float:
    """Eq. 7 without checks: −(l/α) ln(1 − (1 − N/l)/k); 0 if N ≥ l, inf if N ≤ l(1 − k)."""
    if n_fwd >= l:
        return 0.0
    x = (1.0 - n_fwd / l) / k if k > 0.0 else math.inf
    return math.inf if x >= 1.0 else -(l / alpha) * math.log1p(-x)


def optimal_budget(l: float, k: float, alpha: float, n_fwd: float,
                   p_max: float | None = None) -> float:
    """Eq. 7: p*_i = −(l_i/α_i) ln(1 − (1 − N_fwd/l_i)/k_i) for N_fwd < l_i, else 0.

    The budget that makes Eq. 6's constraint tight, l (1 − k + k e^{−αp/l}) = N_fwd.  When
    N_fwd ≤ l (1 − k) no finite budget reaches N_fwd (a request cannot accept more than
    k l tokens): ``inf``, or ``p_max`` if given (every result is capped at ``p_max``).
    """
    l = _check_real("l", l, lo=0.0)
    k = _check_unit("k", k)
    alpha = _check_real("alpha", alpha, lo=0.0, strict=True)
    n_fwd = _check_real("n_fwd", n_fwd, lo=0.0)
    p = _eq7(l, k, alpha, n_fwd)
    return p if p_max is None else min(p, _check_real("p_max", p_max, lo=0.0))


def optimal_budgets(l_list: Sequence[float], k_list: Sequence[float],
                    alpha_list: Sequence[float], c_base: float, c_tok: float,
                    p_max: float | None = None) -> tuple[float, list[float]]:
    """Eq. 6 solved: (N*_fwd, [p*_i]) minimising c_base N_fwd + c_tok Σ_i p_i subject to
    l_i (1 − k_i + k_i e^{−α_i p_i / l_i}) ≤ N_fwd, 0 ≤ p_i (≤ ``p_max`` if given).

    For a given N the cheapest p_i is Eq. 7's p_i(N) (tight constraint, 0 once N ≥ l_i),
    so Eq. 6 is the one-dimensional problem min_N J(N) = c_base N + c_tok Σ_i p_i(N).

    * Range: N ≤ max_i l_i (beyond it J only grows) and N ≥ each request's floor: l_i
      (1 − k_i) exclusive (p_i → ∞ there), or remaining_passes(p_max) inclusive with a
      cap, or l_i itself when k_i = 0 (no drafting gain: p_i = 0).
    * Convexity: on N < l_i, dp_i/dN = −1 / (α_i (k_i − 1 + N/l_i)), negative and
      increasing; at N = l_i it jumps up to 0.  So dJ/dN = c_base − c_tok Σ_{l_i > N}
      1 / (α_i (k_i − 1 + N/l_i)) is non-decreasing, J is convex, and N* is where dJ/dN
      changes sign, found by bisection (to a relative 1e-13, or float resolution).
      If dJ/dN < 0 up to max_i l_i, N* = max_i l_i and nobody drafts (drafting the
      longest request costs more tokens than the passes it saves, c_tok > c_base α k);
      if dJ/dN ≥ 0 at a capped floor, N* is that floor.

    Returns (0.0, []) for an empty batch; requests with l_i = 0 or k_i = 0 get 0.
    """
    n = _check_same_length(l_list=l_list, k_list=k_list, alpha_list=alpha_list)
    ls = [_check_real(f"l_list[{i}]", v, lo=0.0) for i, v in enumerate(l_list)]
    ks = [_check_unit(f"k_list[{i}]", v) for i, v in enumerate(k_list)]
    alphas = [_check_real(f"alpha_list[{i}]", v, lo=0.0, strict=True)
              for i, v in enumerate(alpha_list)]
    c_base = _check_real("c_base", c_base, lo=0.0)
    c_tok = _check_real("c_tok", c_tok, lo=0.0, strict=True)
    if p_max is not None:
        p_max = _check_real("p_max", p_max, lo=0.0)
    if n == 0:
        return 0.0, []
    top = max(ls)

    # Floors: the largest closed one (reachable) and the largest open one (p -> inf).
    closed = 0.0
    open_ = -math.inf
    terms = []                                   # (l_i, α_i, k_i − 1) of drafting requests
    for l, k, alpha in zip(ls, ks, alphas):
        if l == 0.0:
            continue
        if k == 0.0:
            closed = max(closed, l)
            continue
        terms.append((l, alpha, k - 1.0))
        if p_max is None:
            open_ = max(open_, l * (1.0 - k))
        else:
            closed = max(closed, l * (1.0 - k + k * math.exp(-alpha * p_max / l)))

    def slope(N: float) -> float:               # right derivative dJ/dN
        return c_base - c_tok * math.fsum(1.0 / (a * (km1 + N / l))
                                          for l, a, km1 in terms if l > N)

    if open_ >= closed:
        lo = open_                               # slope(lo+) = −inf
    else:
        lo = closed
        if lo >= top or slope(lo) >= 0.0:
            return _result(lo, ls, ks, alphas, p_max)
    hi = top
    while hi - lo > 1e-13 * hi:
        mid = 0.5 * (lo + hi)
        if not lo < mid < hi:
            break
        if slope(mid) < 0.0:
            lo = mid
        else:
            hi = mid
    return _result(hi, ls, ks, alphas, p_max)


def _result(n_fwd: float, ls: list[float], ks: list[float], alphas: list[float],
            p_max: float | None) -> tuple[float, list[float]]:
    budgets = [_eq7(l, k, a, n_fwd) if l > 0.0 and k > 0.0 else 0.0
               for l, k, a in zip(ls, ks, alphas)]
    if p_max is not None:
        budgets = [min(p, p_max) for p in budgets]
    return n_fwd, budgets


def step_budget(p_total: float, n_fwd: float, cap: int) -> int:
    """Eq. 7's total spread over the passes: min(cap, round(p*_i / N_fwd)), rounding
    half up.

    Our reading: Eq. 3 counts the tokens proposed over a whole generation, which takes
    N_fwd passes at the optimum (every active constraint of Eq. 6 is tight), and one
    verification round proposes at most ``cap`` tokens, so an even spread is
    p*_i / N_fwd per pass.  ``p_total`` may be ``inf`` (gives ``cap``); ``n_fwd`` ≤ 0
    gives ``cap`` for a positive total.
    """
    if (isinstance(p_total, bool) or not isinstance(p_total, numbers.Real)
            or math.isnan(p_total) or p_total < 0):
        raise ValueError(f"p_total must be a number >= 0 (inf allowed), got {p_total!r}")
    p_total = float(p_total)
    n_fwd = _check_real("n_fwd", n_fwd)
    cap = _check_int("cap", cap, 0)
    if p_total == 0.0:
        return 0
    if n_fwd <= 0.0 or math.isinf(p_total):
        return cap
    return min(cap, math.floor(p_total / n_fwd + 0.5))


# -------------------------------------------------- fitting (k, α) to the engine's counts


@dataclass
class AcceptanceEstimate:
    """Running counts for :func:`estimate_k_alpha`: draft tokens ``proposed``, of them
    ``accepted``, and tokens ``generated`` (accepted + one sampled token per
    verification step) over the steps observed."""

    proposed: int = 0
    accepted: int = 0
    generated: int = 0

    def observe(self, proposed: int, accepted: int, generated: int) -> None:
        """Add one step's (or one request's) counts."""
        proposed = _check_int("proposed", proposed, 0)
        accepted = _check_int("accepted", accepted, 0)
        generated = _check_int("generated", generated, 0)
        if accepted > proposed or accepted > generated:
            raise ValueError(f"accepted ({accepted}) must not exceed proposed ({proposed}) "
                             f"or generated ({generated})")
        self.proposed += proposed
        self.accepted += accepted
        self.generated += generated


def chain_acceptance(proposed: float, accepted: float, generated: float) -> float | None:
    """The per-draft-token acceptance probability q of a geometric acceptance chain,
    matched to the counts (the k of Eq. 3, see :func:`estimate_k_alpha`).

    Each verification step emits its accepted drafts plus one sampled token, so the
    counts cover R = generated − accepted steps with γ = proposed / R drafts and
    a = accepted / R accepted on average.  A chain that accepts each draft with
    probability q until the first rejection accepts S(q, γ) = q + q² + … + q^γ =
    q (1 − q^γ) / (1 − q) per step; S increases in q from 0 to γ, and q solves
    S(q, γ) = a (bisection).  For γ = 1 this is q = accepted / proposed.  1.0 if every
    draft was accepted; ``None`` with no draft or no step.
    """
    if proposed <= 0 or generated - accepted <= 0:
        return None
    if accepted <= 0:
        return 0.0
    if accepted >= proposed:
        return 1.0
    rounds = generated - accepted
    gamma, target = proposed / rounds, accepted / rounds
    lo, hi = 0.0, 1.0
    for _ in range(100):
        q = 0.5 * (lo + hi)
        if not lo < q < hi:
            break
        # S(q, γ) = q (1 − q^γ) / (1 − q), q^γ as exp(γ ln q) for any real γ > 0
        if -q * math.expm1(gamma * math.log(q)) / (1.0 - q) < target:
            lo = q
        else:
            hi = q
    return 0.5 * (lo + hi)


def fit_alpha(proposed: float, accepted: float, generated: float, k: float) -> float | None:
    """α such that Eq. 3 passes through the counts with capacity k:
    A = k l (1 − e^{−αP/l})  ⇔  α = −(l/P) ln(1 − A/(k l)), for P > 0 and 0 < A < k l
    (else ``None``: the counts say nothing about α, or need more than k l accepted)."""
    if proposed <= 0 or accepted <= 0 or k <= 0 or accepted >= k * generated:
        return None
    return -(generated / proposed) * math.log1p(-accepted / (k * generated))


def estimate_k(est: AcceptanceEstimate, prior_k: float = 0.5,
               prior_weight: float = 16.0) -> float:
    """Eq. 3's k fitted to the engine's counts: the k half of :func:`estimate_k_alpha`.

    q̂ = :func:`chain_acceptance` of the counts (the per-draft-token acceptance of a
    geometric chain, which is Eq. 3's capacity k), shrunk toward ``prior_k`` by
    ``prior_weight`` pseudo draft tokens: k = (q̂ P + prior_k w) / (P + w); ``prior_k``
    with no draft yet.  Clamped to [0.01, 0.99].
    """
    prior_k = _check_unit("prior_k", prior_k)
    prior_weight = _check_real("prior_weight", prior_weight, lo=0.0)
    P = est.proposed
    q = chain_acceptance(P, est.accepted, est.generated)
    k = prior_k if q is None else (q * P + prior_k * prior_weight) / (P + prior_weight)
    return min(max(k, K_MIN), K_MAX)


def estimate_k_many(proposed, accepted, generated, prior_k, prior_weight: float = 16.0):
    """:func:`estimate_k` for many count triples at once (numpy arrays; ``prior_k`` an
    array or a number): the same k per entry, the bisection of :func:`chain_acceptance`
    run on all entries together (each entry stops where the scalar one does), so a
    drafter step costs ~100 vector operations, not a Python bisection per request.
    Returns a float64 array."""
    import numpy as np

    P = np.asarray(proposed, dtype=np.float64)
    A = np.asarray(accepted, dtype=np.float64)
    G = np.asarray(generated, dtype=np.float64)
    prior = np.broadcast_to(np.asarray(prior_k, dtype=np.float64), P.shape)
    q = np.full(P.shape, np.nan)
    ok = (P > 0) & (G - A > 0)
    q[ok & (A <= 0)] = 0.0
    q[ok & (A > 0) & (A >= P)] = 1.0
    mid = np.flatnonzero(ok & (A > 0) & (A < P))
    if len(mid):
        rounds = G[mid] - A[mid]
        gamma, target = P[mid] / rounds, A[mid] / rounds
        lo, hi = np.zeros(len(mid)), np.ones(len(mid))
        run = np.ones(len(mid), dtype=bool)
        with np.errstate(divide="ignore", invalid="ignore"):
            for _ in range(100):
                x = 0.5 * (lo + hi)
                run &= (lo < x) & (x < hi)
                if not run.any():
                    break
                below = -x * np.expm1(gamma * np.log(x)) / (1.0 - x) < target
                lo = np.where(run & below, x, lo)
                hi = np.where(run & ~below, x, hi)
        q[mid] = 0.5 * (lo + hi)
    k = np.where(np.isnan(q), prior, (np.nan_to_num(q) * P + prior * prior_weight)
                 / (P + prior_weight))
    return np.clip(k, K_MIN, K_MAX)


def estimate_k_alpha(est: AcceptanceEstimate, prior_k: float = 0.5, prior_alpha: float = 1.0,
                     prior_weight: float = 16.0) -> tuple[float, float]:
    """(k, α) of Eq. 3 fitted to the engine's counts (P = proposed, A = accepted,
    l = generated).

    **k.**  Eq. 3's k is the capacity lim_{p→∞} A/l.  Under a geometric acceptance
    chain (each draft accepted with probability q until the first rejection) a step
    with budget γ emits S = q (1 − q^γ)/(1 − q) accepted tokens plus one, so the
    accepted share of generated tokens is S / (S + 1) → q as γ → ∞: k = q.  q is what
    :func:`chain_acceptance` recovers from the counts, and the prior enters as
    ``prior_weight`` pseudo draft tokens at rate ``prior_k``:
    k = (q̂ P + prior_k w) / (P + w).  For one draft per step q̂ = A / P and this is
    (A + prior_k w) / (P + w); with longer drafts A / P would understate q (the drafts
    after the first rejection are never tested), hence the inversion.
    Clamped to [0.01, 0.99].

    **α.**  With k fixed, Eq. 3 through (P, A, l) gives α = −(l/P) ln(1 − A/(k l)) when
    P > 0 and 0 < A < k l (:func:`fit_alpha`), else ``prior_alpha``.  Clamped to
    [0.05, 20].  With no data at all the result is (prior_k, prior_alpha), clamped.
    """
    prior_alpha = _check_real("prior_alpha", prior_alpha, lo=0.0, strict=True)
    k = estimate_k(est, prior_k, prior_weight)
    alpha = fit_alpha(est.proposed, est.accepted, est.generated, k)
    alpha = prior_alpha if alpha is None else alpha
    return k, min(max(alpha, ALPHA_MIN), ALPHA_MAX)
