"""ARRoL's pruning rule: calibration, survival probability, coin, verdict (Alg. 1 l.17-21).

Pure Python, evaluated on the worker for every sample scored at ``l_detect``
(:mod:`vllm_rl.arrol.scorer`); the trainer builds the :class:`Calibration`
(:class:`vllm_rl.control.arrol.CalibrationBuffer`).

- App. A.4: the score s' in [0, 1] (the head's sigmoid) falls in bin
  b(s') = min(B − 1, ⌊B s'⌋) of B = 128; Eq. 1's counts c_b^± with Laplace α give
  P(b | Y = 1) = (c_b^+ + α) / (Σ c^+ + αB), the same for Y = 0, and Bayes with the prior
  π gives the posterior q = π P(b|1) / (π P(b|1) + (1 − π) P(b|0));
- Eq. 2: p = clip(κ + δ + λ(ρ − q), p_min, p_max), the survival probability;
- the sample is kept iff its coin < p, so it is pruned with probability exactly 1 − p;
  the coin comes from the request's seed and prompt (reproducible), or its id.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from vllm_rl.engine.policies import seeded_uniform

BINS = 128


@dataclass(frozen=True)
class Calibration:
    """Eq. 1's counts ``pos`` (c_b^+) and ``neg`` (c_b^-) over ``bins`` bins, Laplace
    ``alpha``, ``prior`` π, and ``delta`` δ of Eq. 2.  The posterior of every bin is
    computed once (``table``); a bad field raises ``ValueError`` naming it."""

    pos: tuple
    neg: tuple
    alpha: float
    prior: float
    delta: float
    bins: int = BINS
    table: tuple = field(default=(), compare=False, repr=False)

    def __post_init__(self):
        object.__setattr__(self, "pos", tuple(int(c) for c in self.pos))
        object.__setattr__(self, "neg", tuple(int(c) for c in self.neg))
        if not isinstance(self.bins, int) or self.bins < 1:
            raise ValueError(f"calibration 'bins'={self.bins!r}: allowed int >= 1")
        for name in ("pos", "neg"):
            v = getattr(self, name)
            if len(v) != self.bins or min(v, default=0) < 0:
                raise ValueError(f"calibration '{name}': allowed {self.bins} counts >= 0")
        if not (self.alpha > 0 and math.isfinite(self.alpha)):
            raise ValueError(f"calibration 'alpha'={self.alpha!r}: allowed float > 0")
        if not 0 < self.prior < 1:
            raise ValueError(f"calibration 'prior'={self.prior!r}: allowed float in (0, 1)")
        if not math.isfinite(self.delta):
            raise ValueError(f"calibration 'delta'={self.delta!r}: allowed a finite float")
        b, a = self.bins, self.alpha
        sp, sn = sum(self.pos) + a * b, sum(self.neg) + a * b
        table = []
        for cp, cn in zip(self.pos, self.neg):
            l1, l0 = (cp + a) / sp, (cn + a) / sn
            table.append(self.prior * l1 / (self.prior * l1 + (1 - self.prior) * l0))
        object.__setattr__(self, "table", tuple(table))

    def to_dict(self) -> dict:
        return {"pos": list(self.pos), "neg": list(self.neg), "alpha": self.alpha,
                "prior": self.prior, "delta": self.delta, "bins": self.bins}

    @classmethod
    def from_dict(cls, d: dict) -> "Calibration":
        keys = {"pos", "neg", "alpha", "prior", "delta", "bins"}
        if not isinstance(d, dict) or set(d) - keys or {"pos", "neg", "alpha", "prior", "delta"} - set(d):
            raise ValueError(f"calibration: a mapping with keys {sorted(keys)}")
        return cls(d["pos"], d["neg"], float(d["alpha"]), float(d["prior"]),
                   float(d["delta"]), int(d.get("bins", BINS)))


def bin_of(s: float, bins: int = BINS) -> int:
    """b(s') = min(B − 1, ⌊B s'⌋) with s' clipped into [0, 1] (App. A.4)."""
    s = min(1.0, max(0.0, s))
    return min(bins - 1, int(math.floor(bins * s)))


def posterior(cal: Calibration, s: float) -> float:
    """q(s') = P(Y = 1 | b(s')): Eq. 1 with Laplace smoothing, then Bayes (App. A.4)."""
    return cal.table[bin_of(s, cal.bins)]


def survival(q, delta, kappa, rho, lam, p_min, p_max) -> float:
    """Eq. 2: p = clip(κ + δ + λ(ρ − q), p_min, p_max)."""
    return min(p_max, max(p_min, kappa + delta + lam * (rho - q)))


def prune_coin(seed, prompt_token_ids, request_id: str) -> float:
    """The sample's uniform coin in [0, 1): from its seed and prompt when seeded (so a
    seeded rollout prunes reproducibly), else from its request id.  Salted apart from
    DUET's keep coin, so the two decisions are independent."""
    return seeded_uniform("arrol-coin", seed, prompt_token_ids, request_id)


@dataclass(frozen=True)
class Verdict:
    """What happened to a scored sample: its score, q and p (None in the cold start)."""

    score: float
    q: float | None
    p: float | None
    pruned: bool


def decide(score: float, cal: Calibration | None, flags, coin: float) -> Verdict:
    """Alg. 1 l.18-19.  ``flags`` has ``kappa, rho, lam, p_min, p_max``.  Without a
    calibration (cold start) the sample is scored, never pruned; else it is pruned iff
    ``coin >= p``."""
    if cal is None:
        return Verdict(score, None, None, False)
    q = posterior(cal, score)
    p = survival(q, cal.delta, flags.kappa, flags.rho, flags.lam, flags.p_min, flags.p_max)
    return Verdict(score, q, p, not coin < p)
