"""DUET's loss weights (Eq. 6): each rollout's status, its abort propensity, and the
stratification factor of its prompt.

The engine reports every rollout as :data:`KEPT` (ended on its own or trimmed after its
marker), :data:`EPS_KEPT` (no marker by K2 + G, kept by its coin) or :data:`ABORTED` (Alg.
A.10 l.15-32); :func:`loss_weights` gives w_qi = (1 − I_abort) / (s_q^pre · p_abort), with
s_q^pre = clip(n_q / n̄, ε_pre, 1) (Alg. A.10 l.9, l.42).  Pure Python.
"""
from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from typing import Any
from vllm_rl.checks import check_int as _check_int

from vllm_rl.checks import check_unit


# Rollout outcomes as the engine reports them (Alg. A.10 lines 15-32).
KEPT = "kept"          # ended on its own or tail-trimmed after a marker: p_abort = 1


EPS_KEPT = "eps_kept"  # no marker by K2 + G, the ε-coin said keep: ran on, p_abort = ε


ABORTED = "aborted"    # no marker by K2 + G, the ε-coin said abort: I_abort = 1, masked out


STATUSES = (KEPT, EPS_KEPT, ABORTED)


EPS_PRE = 0.05


EPS_ABORT = 0.05


def _check_status(name: str, status: Any) -> str:
    if status not in STATUSES:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, STATUSES))}, "
                         f"got {status!r}")
    return status


def stratification_factors(counts: Sequence[int], eps_pre: float = EPS_PRE) -> list[float]:
    """Sec. 3.3 / Alg. A.10 line 9: s_q^pre = clip(n_q / n̄_t, ε_pre, 1), n̄_t = M⁻¹ Σ_q n_q.

    A stratification factor, not a sampling propensity (A5): prompts given fewer
    rollouts than the batch mean are up-weighted by 1/s_pre in Eq. 6, at most 1/ε_pre.
    """
    counts = [_check_int(f"counts[{i}]", n, 1) for i, n in enumerate(counts)]
    if not counts:
        raise ValueError("counts must not be empty")
    eps_pre = check_unit("eps_pre", eps_pre, open_low=True)
    mean = math.fsum(counts) / len(counts)
    return [min(1.0, max(eps_pre, n / mean)) for n in counts]


def status_of(info) -> str:
    """The DUET status of a sample from its engine record (:class:`vllm_rl.RolloutInfo`):
    a sample something else ended before its natural end (ARRoL's coin, the client, a
    DARTS stop) counts as :data:`ABORTED` here too (weight 0, out of the estimates)."""
    from vllm_rl.outcome import NOT_RUN_OUT

    if info.eps_kept:
        return EPS_KEPT
    if info.reason in NOT_RUN_OUT:
        return ABORTED
    return KEPT


def abort_propensity(status: str, eps_abort: float = EPS_ABORT) -> float:
    """p_{q,i}^abort of Sec. 3.2 / Alg. A.10 line 32: ε_abort once the keep coin was
    drawn (no marker by K2 + G: :data:`EPS_KEPT` or :data:`ABORTED`), else 1."""
    _check_status("status", status)
    eps_abort = check_unit("eps_abort", eps_abort, open_low=True)
    return 1.0 if status == KEPT else eps_abort


def loss_weight(s_pre: float, status: str, eps_abort: float = EPS_ABORT) -> float:
    """Eq. 6's w_{q,i} = (1 − I_{q,i}^abort) / (s_q^pre · p_{q,i}^abort).

    1/s_pre for a :data:`KEPT` rollout, 1/(s_pre ε_abort) for an :data:`EPS_KEPT` one,
    0 for an :data:`ABORTED` one.
    """
    s_pre = check_unit("s_pre", s_pre, open_low=True)
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


__all__ = ["ABORTED", "EPS_ABORT", "EPS_KEPT", "EPS_PRE", "KEPT", "STATUSES", "abort_propensity",
           "loss_weight", "loss_weights", "status_of", "stratification_factors"]
