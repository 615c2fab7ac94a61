"""Group-relative advantages over the marks' baselines, and the step's diagnostics.

:func:`group_advantages` is GRPO's outcome advantage (Shao et al. 2024; DUET Alg. A.10
l.38; ARRoL Alg. 1 l.7) with the baseline set of :mod:`.marks`: for a group g,
mean_g and std_g are taken over its *baseline* members, and each *loss* member gets
``weight * (r - mean_g) / (std_g + eps)`` (``scale="std"``) or ``weight * (r - mean_g)``
(``scale="none"``, Dr. GRPO); every other sample gets 0.  A group with fewer than two
baseline members has no baseline: its advantages are 0.

:func:`step_diagnostics` is what a trainer should read every step to see whether the
techniques still leave a learning signal:

* ``loss_samples_mean`` / ``loss_samples_min``: samples in the loss per group;
* ``zero_adv_groups``: the share of groups whose loss members all have advantage 0 (all
  rewards equal: no signal from that prompt);
* ``ess`` / ``ess_fraction``: the effective sample size of the step's advantages,
  (Σ|a_i|)² / Σ a_i² over the loss members (Kish's formula on |a|: it equals the number
  of samples when every |a_i| is the same and falls when a few samples, e.g. 1/eps-weighted
  ones, carry the gradient), and that over the number of loss members;
* ``eps_weight_share``: the share of Σ|a_i| carried by DUET's 1/eps-weighted samples.
"""
from __future__ import annotations

import math
from collections import defaultdict
from typing import Hashable, Sequence

from vllm_rl.integrations.common.marks import TrainingMark

ZERO = 1e-8


def group_advantages(rewards: Sequence[float], marks: Sequence[TrainingMark],
                     groups: Sequence[Hashable], scale: str = "std",
                     eps: float = 1e-4) -> list[float]:
    """Per-sample advantages (module docstring); ``groups[i]`` names sample i's group."""
    if scale not in ("std", "none"):
        raise ValueError(f"scale={scale!r}: allowed 'std' or 'none'")
    if not len(rewards) == len(marks) == len(groups):
        raise ValueError(f"{len(rewards)} rewards, {len(marks)} marks, {len(groups)} groups")
    members: dict[Hashable, list[float]] = defaultdict(list)
    for r, m, g in zip(rewards, marks, groups):
        if m.baseline:
            members[g].append(float(r))
    stats = {}
    for g, rs in members.items():
        if len(rs) < 2:
            continue
        mean = sum(rs) / len(rs)
        std = math.sqrt(sum((r - mean) ** 2 for r in rs) / (len(rs) - 1))
        stats[g] = (mean, std)
    out = []
    for r, m, g in zip(rewards, marks, groups):
        if not m.keep or g not in stats:
            out.append(0.0)
            continue
        mean, std = stats[g]
        a = float(r) - mean
        out.append(m.weight * (a / (std + eps) if scale == "std" else a))
    return out


def step_diagnostics(marks: Sequence[TrainingMark], advantages: Sequence[float],
                     groups: Sequence[Hashable]) -> dict[str, float]:
    """The step's learning-signal diagnostics (module docstring), from the marks and the
    final (weighted) advantages of its samples."""
    per_group: dict[Hashable, list[tuple[TrainingMark, float]]] = defaultdict(list)
    for m, a, g in zip(marks, advantages, groups):
        per_group[g].append((m, float(a)))
    in_loss = [[(m, a) for m, a in rows if m.keep] for rows in per_group.values()]
    counts = [len(rows) for rows in in_loss]
    zero = sum(1 for rows in in_loss if all(abs(a) <= ZERO for _, a in rows))
    flat = [(m, abs(a)) for rows in in_loss for m, a in rows]
    total = sum(a for _, a in flat)
    squares = sum(a * a for _, a in flat)
    ess = total * total / squares if squares > 0 else 0.0
    eps_share = sum(a for m, a in flat if m.eps_kept) / total if total > 0 else 0.0
    n = len(per_group)
    return {
        "groups": float(n),
        "loss_samples": float(len(flat)),
        "loss_samples_mean": sum(counts) / n if n else 0.0,
        "loss_samples_min": float(min(counts)) if counts else 0.0,
        "zero_adv_groups": zero / n if n else 0.0,
        "ess": ess,
        "ess_fraction": ess / len(flat) if flat else 0.0,
        "eps_weight_share": eps_share,
    }
