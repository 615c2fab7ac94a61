"""ARRoL in the engine: calibration, survival probability, coin, verdict (Alg. 1 l.17-21).

Pure Python (stdlib only), evaluated on the worker for every sample when it first reaches
``l_detect`` tokens (Alg. 1 l.17, :mod:`vllm_rl.arrol.scorer`); the trainer builds the
:class:`Calibration` (:class:`vllm_rl.arrol.calibration.CalibrationBuffer`, Alg. 1 l.3) and
pushes it with ``arrol_update``.  For a sample with quality score s' (Alg. 1 l.18):

* App. A.4: s' in [0, 1] (the head's sigmoid) falls in bin b(s') = min(B − 1, ⌊B s'⌋) of
  B = 128 (:func:`bin_of`);
* App. A.4, Eq. 1 + Laplace α: P(b | Y = 1) = (c_b^+ + α) / (Σ_b' c_b'^+ + αB), the same
  for Y = 0 with c^- (:func:`likelihoods`);
* App. A.4, Bayes with the prior π: q = π P(b|1) / (π P(b|1) + (1 − π) P(b|0))
  (:func:`posterior`; one table lookup, the table is built with the calibration);
* Eq. 2: p = clip(κ + δ + λ(ρ − q), p_min, p_max), the survival probability
  (:func:`survival`);
* Alg. 1 l.19: the sample is kept iff its coin < p, so it is pruned with probability
  exactly 1 − p (:func:`decide`).  The coin (:func:`prune_coin`) comes from the request's
  seed and prompt (a seeded rollout prunes reproducibly) or from its id.

Without a calibration (the cold start, Sec. 5: the first 20 training steps) the sample is
scored and recorded but never pruned.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from vllm_rl.coins import seeded_uniform

BINS = 128      # B of App. A.4 ("In practice, we use λ = 0.5, B = 128")

_REQUIRED = ("pos", "neg", "alpha", "prior", "delta")
_KEYS = (*_REQUIRED, "bins", "auc")


def _is_int(v: Any) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _is_real(v: Any) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)


@dataclass(frozen=True)
class Calibration:
    """The binned estimator the trainer sends with the requests (Alg. 1 l.3, ``h_t``).

    ``pos`` / ``neg``: Eq. 1's counts c_b^+ / c_b^- over ``bins`` bins, finite reals >= 0
    (inverse-propensity weighted counts: a survivor of a coin stands for the samples the
    coin removed; plain counts are ints, still accepted);
    ``alpha``: the Laplace α (> 0); ``prior``: π = P(Y = 1) in (0, 1); ``delta``: the δ of
    Eq. 2 (finite; the trainer solves it so that E[p] = κ); ``auc``: the head's held-out
    within-group AUC that opened the pruning gate (optional, in [0, 1]; every record
    scored with this calibration carries it as ``head_auc``).  A bad field raises
    ``ValueError`` naming it and what is allowed.  The likelihoods and the posterior of
    every bin are computed once here, so :func:`posterior` is O(1).
    """

    pos: tuple[float, ...]
    neg: tuple[float, ...]
    alpha: float
    prior: float
    delta: float
    bins: int = BINS
    auc: float | None = None
    table: tuple[float, ...] = field(init=False, compare=False, repr=False)
    lik_pos: tuple[float, ...] = field(init=False, compare=False, repr=False)
    lik_neg: tuple[float, ...] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not _is_int(self.bins) or self.bins < 1:
            raise ValueError(f"Calibration.bins={self.bins!r}: allowed an int >= 1")
        for name in ("pos", "neg"):
            v = getattr(self, name)
            if isinstance(v, (str, bytes)) or not hasattr(v, "__len__") \
                    or len(v) != self.bins or not all(_is_real(c) and c >= 0 for c in v):
                raise ValueError(f"Calibration.{name}: allowed {self.bins} (bins) finite "
                                 f"reals >= 0 (weighted counts), got {v!r}"[:200])
            object.__setattr__(self, name, tuple(c if _is_int(c) else float(c) for c in v))
        if not _is_real(self.alpha) or self.alpha <= 0:
            raise ValueError(f"Calibration.alpha={self.alpha!r}: allowed a finite float > 0")
        if not _is_real(self.prior) or not 0 < self.prior < 1:
            raise ValueError(f"Calibration.prior={self.prior!r}: allowed a float in (0, 1)")
        if not _is_real(self.delta):
            raise ValueError(f"Calibration.delta={self.delta!r}: allowed a finite float")
        if self.auc is not None:
            if not _is_real(self.auc) or not 0.0 <= self.auc <= 1.0:
                raise ValueError(f"Calibration.auc={self.auc!r}: allowed a float in [0, 1] "
                                 "or None")
            object.__setattr__(self, "auc", float(self.auc))
        for name in ("alpha", "prior", "delta"):
            object.__setattr__(self, name, float(getattr(self, name)))
        a, b, pi = self.alpha, self.bins, self.prior
        sp, sn = sum(self.pos) + a * b, sum(self.neg) + a * b
        l1 = tuple((c + a) / sp for c in self.pos)              # P(b | Y = 1)
        l0 = tuple((c + a) / sn for c in self.neg)              # P(b | Y = 0)
        q = tuple(pi * x / (pi * x + (1 - pi) * y) for x, y in zip(l1, l0))
        object.__setattr__(self, "lik_pos", l1)
        object.__setattr__(self, "lik_neg", l0)
        object.__setattr__(self, "table", q)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able: ``{"pos": [...], "neg": [...], "alpha", "prior", "delta", "bins"}``
        and ``"auc"`` where set."""
        d = {"pos": list(self.pos), "neg": list(self.neg), "alpha": self.alpha,
             "prior": self.prior, "delta": self.delta, "bins": self.bins}
        if self.auc is not None:
            d["auc"] = self.auc
        return d

    @classmethod
    def from_dict(cls, d: Any) -> "Calibration":
        """The inverse of :meth:`to_dict`.  ``pos``, ``neg``, ``alpha``, ``prior`` and
        ``delta`` are required, ``bins`` defaults to :data:`BINS`, ``auc`` to None; an
        unknown or missing
        key raises ``ValueError`` naming it."""
        if not isinstance(d, dict):
            raise ValueError(f"calibration: a mapping with keys {list(_KEYS)}, got "
                             f"{type(d).__name__}")
        unknown = sorted(map(str, set(d) - set(_KEYS)))
        missing = [k for k in _REQUIRED if k not in d]
        if unknown or missing:
            raise ValueError(f"calibration: unknown keys {unknown}, missing keys {missing}; "
                             f"allowed keys {list(_KEYS)} (bins optional, default {BINS}; "
                             "auc optional)")
        return cls(d["pos"], d["neg"], d["alpha"], d["prior"], d["delta"],
                   d.get("bins", BINS), d.get("auc"))


# The trace features a head may read beside the hidden state, over a sample's first
# ``l_detect`` tokens (raw model log-probabilities, before temperature): the mean and the
# minimum log-probability of its tokens and the mean entropy of its next-token
# distributions (DeepConf-style trace confidence, ARRoL Fig. 2a).
TRACE_FEATURES = ("mean_logprob", "min_logprob", "mean_entropy")


def bin_of(s: float, bins: int = BINS) -> int:
    """App. A.4: b(s') = min(B − 1, ⌊B s'⌋), with s' clipped into [0, 1].

    The head already ends in a sigmoid, so s' = s (App. A.4: "normalize the score to
    [0, 1] using sigmoid").  A NaN score falls in bin 0 (it never raises: this runs in the
    scheduler).
    """
    if not s >= 0.0:            # negative or NaN
        return 0
    if s >= 1.0:
        return bins - 1
    return min(bins - 1, int(math.floor(bins * s)))


def likelihoods(cal: Calibration, s: float) -> tuple[float, float]:
    """(P(b | Y = 1), P(b | Y = 0)) of the bin b = b(s): Eq. 1's counts with Laplace α,
    (c_b^± + α) / (Σ_b' c_b'^± + αB) (App. A.4)."""
    b = bin_of(s, cal.bins)
    return cal.lik_pos[b], cal.lik_neg[b]


def posterior(cal: Calibration, s: float) -> float:
    """q(s) = P(Y = 1 | b(s)) = π P(b|1) / (π P(b|1) + (1 − π) P(b|0)) (App. A.4, Bayes
    on the :func:`likelihoods`); a table lookup."""
    return cal.table[bin_of(s, cal.bins)]


def survival(q: float, delta: float, kappa: float, rho: float, lam: float, p_min: float,
             p_max: float) -> float:
    """Eq. 2: p = clip(κ + δ + λ(ρ − q), p_min, p_max), the survival probability.

    With δ solved so that E[p] = κ (App. A.4, :func:`vllm_rl.arrol.calibration.solve_delta`)
    ρ has no effect: it shifts every p by the same λρ, which δ takes back exactly (the
    clip included).  So Eq. 2 prunes the likelier-correct samples harder whatever ρ is:
    it brings a group toward balance where the group is mostly correct (Lemma 4.1's case
    μ* > ρ) and away from it where it is mostly wrong (``vllm-rl bench arrol-gate``
    measures where it helps on a model's own groups)."""
    return min(p_max, max(p_min, kappa + delta + lam * (rho - q)))


def darts_share(size: int, redundant: int) -> float:
    """s = M/M' of a DARTS group of M = ``size`` kept out of M' = ``redundant`` (0 without
    redundancy: ARRoL acts as alone)."""
    return size / redundant if redundant > size else 0.0


def composed_survival(p: float, share: float) -> float:
    """ARRoL's survival inside a DARTS group (the composition rule,
    ``docs/ARCHITECTURE.md``): DARTS owns the M training slots, so Eq. 2's p acts on the
    redundant M' − M only, p' = s + (1 − s) p with s = M/M' (:func:`darts_share`).  Then
    E[p'] = s + (1 − s) E[p] = κ' = M/M' + κ (1 − M/M') exactly where δ gives E[p] = κ,
    and p' stays inside [s + (1 − s) p_min, s + (1 − s) p_max], a range that holds κ'
    whenever [p_min, p_max] holds κ: in expectation ARRoL prunes (1 − κ)(M' − M) samples
    and leaves DARTS M + κ (M' − M) to select from.  ``share`` 0: p unchanged."""
    return p if share <= 0.0 else share + (1.0 - share) * p


def composed_kappa(kappa: float, size: int, redundant: int) -> float:
    """κ' = M/M' + κ (1 − M/M'): the mean of :func:`composed_survival` over a group whose
    Eq. 2 p has mean κ (without redundancy, M' = M, κ unchanged)."""
    return composed_survival(kappa, darts_share(size, redundant))


def prune_coin(seed: int | None, prompt_token_ids, request_id: str) -> float:
    """The sample's uniform coin in [0, 1) for Alg. 1 l.19, fresh randomness independent
    of the generated tokens.

    Built as :func:`vllm_rl.duet.rule.seeded_coin`: from the seed and the prompt
    when the request is seeded (reproducible; each child of an ``n > 1`` request has its
    own seed), else from the (random) request id; salted ``"arrol-coin"`` so it is
    independent of DUET's keep coin for the same request.
    """
    return seeded_uniform("arrol-coin", seed, prompt_token_ids, request_id)


class ArrolVerdict(NamedTuple):
    """A scored sample's verdict as it travels from the worker to the scheduler
    (``StepOutput.verdicts[request_id]``, :mod:`vllm_rl.step_output`; pickled with the
    output across vLLM's multiprocess executor): the head's score s' (Alg. 1 l.18), the posterior q
    (App. A.4, Eq. 1 and Bayes) and the survival p (Eq. 2), both None in the cold start,
    whether its coin pruned it (l.19), the head version, whether its hidden state is kept
    on the worker, and its trace features.  Compact: no vector travels in it."""

    score: float
    q: float | None
    p: float | None
    pruned: bool
    version: int
    hidden: bool                        # return_hidden: its hidden state at l_detect is
                                        # kept on the worker under its request id
                                        # (vllm_rl.arrol.hidden; the arrol_hidden RPC)
    trace: tuple[float, ...] | None     # TRACE_FEATURES over the first l_detect tokens
    auc: float | None = None            # the calibration's head AUC (Calibration.auc)


@dataclass(frozen=True)
class Verdict:
    """What happened to a scored sample: its score s', posterior q and survival p (both
    None in the cold start), and whether it was pruned."""

    score: float
    q: float | None
    p: float | None
    pruned: bool


def decide(score: float, cal: Calibration | None, flags: Any, coin: float,
           share: float = 0.0) -> Verdict:
    """Alg. 1 l.17-21 for a sample at its first time at ``l_detect``.

    ``flags`` has ``kappa, rho, lam, p_min, p_max`` (:class:`vllm_rl.flags.ArrolFlags`).
    ``cal`` None is the cold start: scored and recorded, never pruned (q = p = None).
    Otherwise q = :func:`posterior` (App. A.4), p = :func:`survival` (Eq. 2), composed
    with a DARTS group's ``share`` M/M' (:func:`composed_survival`), and the sample is
    kept iff ``coin < p`` (l.19: with ``coin`` ~ U[0, 1) it is kept with probability
    exactly p and pruned with probability 1 − p).
    """
    if cal is None:
        return Verdict(score, None, None, False)
    q = posterior(cal, score)
    p = composed_survival(survival(q, cal.delta, flags.kappa, flags.rho, flags.lam,
                                   flags.p_min, flags.p_max), share)
    return Verdict(score, q, p, not coin < p)


__all__ = ["BINS", "TRACE_FEATURES", "ArrolVerdict", "Calibration", "Verdict", "bin_of",
           "decide", "likelihoods",
           "composed_kappa", "composed_survival", "darts_share", "posterior", "prune_coin",
           "survival"]
