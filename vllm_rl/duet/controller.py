"""DUET's controller on the trainer side: the running state that ties a step together.

DUET (Hu et al., arXiv:2605.08441) splits a per-step token budget ``B`` over the prompts
of a batch and stops rollouts early in the engine.  Each step the trainer (Sec. 3.1-3.3,
Alg. A.10):

1. scores each prompt with the running surrogate ŝ_q = max(s_floor, σ̂_q^obs) of Sec. 3.1
   (:meth:`DuetController.score`) and estimates its expected rollout length L̂_q
   (:meth:`DuetController.length`);
2. splits ``B`` by the cost-weighted Neyman rule (Theorem 1, Eq. 2 / Eq. 4), λ* found by
   bisection warm-started at the previous step's λ*: :func:`.allocation.allocate`;
3. sends n_q rollouts per prompt; the engine applies the marker-gated abort (Sec. 3.2,
   Eq. 5; :mod:`.rule`) and reports every rollout as kept, ε-kept or aborted;
4. weights the rollouts in the GRPO loss by Eq. 6: :func:`.weights.loss_weights`;
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

Everything here is pure Python (stdlib only) and deterministic.
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

from vllm_rl.checks import check_int as _check_int
from vllm_rl.checks import check_real as _check_real
from vllm_rl.checks import check_same_length as _check_same_length
from vllm_rl.checks import check_unit
from vllm_rl.duet.allocation import N_MIN, Allocation, _check_n_max, _check_reals, allocate
from vllm_rl.duet.weights import (ABORTED, EPS_ABORT, EPS_PRE, KEPT, _check_status,
                                  loss_weights, stratification_factors)

__all__ = ["DuetController", "percentile", "sigma_obs"]


# Defaults from App. A.3 (s_floor, ε_pre, 5th percentile) and Table 3 (ε_abort).
S_FLOOR = 0.01
FLOOR_PERCENTILE = 5.0









# --------------------------------------------------------- Theorem 1: continuous optimum














# -------------------------------------------------------- Eq. 4: the integer allocation
















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
        self.eps_pre = check_unit("eps_pre", eps_pre, open_low=True)
        self.eps_abort = check_unit("eps_abort", eps_abort, open_low=True)
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
