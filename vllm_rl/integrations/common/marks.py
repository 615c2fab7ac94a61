"""From records to each sample's place in the loss: :func:`training_marks`.

A sample's record (:class:`~vllm_rl.outcome.RolloutInfo`) and the flags it ran with say
what each paper's estimator needs.  Per sample a :class:`TrainingMark` says whether it is
**in the loss** (``keep``), with which **weight** (multiplied into its advantage: the
clipped PPO surrogate is positively homogeneous in the advantage), and whether its reward
counts in its group's **baseline** (the mean, and std, that group-relative advantages
subtract and divide by).  The rules, by technique and under the composition rule
(``docs/ARCHITECTURE.md``):

* **no flags** (stock): in the loss and the baseline, weight 1;
* **DARTS** (Alg. 2, Sec. 4.1.2): the group is annotated whole
  (:func:`vllm_rl.darts.rule.annotate_group`): early stop selects the M shortest valid,
  dual-end the K shortest and L longest valid; the selected M are the training group, in
  the loss and the baseline (Eq. 3 is the mean over the selected), the rest in neither.
  Inside a DARTS group a sample DUET's coin kept past the gate is outside DARTS's pool and
  always selected (``"eps_kept"``) with its 1/eps weight, in the loss and the baseline;
  one aborted at the gate is in neither;
* **DUET** without DARTS (Alg. A.10 l.35-42): every rollout of the prompt enters the
  group baseline, aborted ones with the verifier's reward of their partial text (l.38:
  "baseline includes aborted rewards"); an aborted rollout's advantage is zeroed and it
  leaves the loss (l.39-40); one kept at the gate by its coin has weight 1/eps (Eq. 6);
* **ARRoL** (Alg. 1 l.6): a pruned rollout is filtered out before rewards and
  advantages: in neither;
* a sample aborted by the client or the framework (reason ``abort``, or flags and no
  record: aborted before its first token): in neither;
* partial rollouts: a sample dropped past the staleness cap (``stale``) is in neither
  (the cap's price: the long samples it drops leave the baseline, ``docs/ARCHITECTURE.md``),
  and a ``carried`` part is not a sample yet (its group trains once it completes).
"""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

from vllm_rl.flags import KEY, RLFlags, read
from vllm_rl.darts.rule import annotate_group
from vllm_rl.outcome import Reason, RolloutInfo


@dataclass(frozen=True)
class TrainingMark:
    """A sample's place in the loss: ``keep`` (in the loss), ``weight`` (its advantage
    multiplier; 0 when not kept), ``baseline`` (its reward counts in the group baseline)
    and its annotated record (None for a sample without flags, or aborted unstarted)."""

    keep: bool
    weight: float
    baseline: bool
    info: RolloutInfo | None = None
    eps_kept: bool = False            # DUET: kept at the gate by its coin (weight 1/eps)
    padding: bool = False             # no sample: a row a trainer's fixed group shape
                                      # needed (TRL's slots), out of everything

    @property
    def reason(self) -> str:
        if self.info is not None:
            return self.info.reason.value
        if self.padding:
            return "padding"
        return "stock" if self.keep else Reason.ABORT.value


def _read(raw: Mapping[str, Any] | None, group_id: str | None) -> RLFlags | None:
    """A sample's flags as the engine read them (:func:`vllm_rl.flags.read`; the
    ``vllm_rl`` value of its ``extra_args``), its group named by the record."""
    if not raw:
        return None
    return read({KEY: dict(raw)}, default_group_id=group_id)


def training_marks(infos: Sequence[RolloutInfo | None],
                   flags: Sequence[Mapping[str, Any] | str | None]) -> list[TrainingMark]:
    """One :class:`TrainingMark` per sample (module docstring).  ``infos[i]`` is sample
    i's record (None: none came back), ``flags[i]`` the ``vllm_rl`` flags it ran with
    (a dict or its JSON; None: no flags).  DARTS groups are annotated whole, by the
    record's group id."""
    infos = list(infos)
    flags = [json.loads(f) if isinstance(f, str) else f for f in flags]
    typed: dict[int, RLFlags | None] = {}     # one read per distinct flags object
    groups: dict[str, tuple[RLFlags, list[int]]] = {}
    for i, (info, f) in enumerate(zip(infos, flags)):
        if info is None or not f or not info.group_id:
            continue
        key = id(f)
        if key not in typed:
            typed[key] = _read(f, info.group_id)
        t = typed[key]
        if t is not None and t.darts is not None:
            groups.setdefault(info.group_id, (t, []))[1].append(i)
    in_darts = set()
    for gid, (t, members) in groups.items():
        early = t.darts.early_stop(t.group)
        marked = annotate_group([infos[i] for i in members], t.group.size,
                                t.darts.k, early)
        for i, info in zip(members, marked):
            infos[i] = info
            in_darts.add(i)
    marks = []
    for i, (info, f) in enumerate(zip(infos, flags)):
        if info is None:         # no flags: stock; flags but no record: aborted unstarted
            marks.append(TrainingMark(keep=not f, weight=0.0 if f else 1.0, baseline=not f))
            continue
        reason = info.reason
        if reason in (Reason.ABORT, Reason.STALE, Reason.CARRIED):
            marks.append(TrainingMark(False, 0.0, False, replace(info, weight=0.0)))
            continue
        weight = float(info.weight)
        eps_kept = info.eps_kept and weight > 0
        if i in in_darts:
            baseline = bool(info.selected)
        else:
            baseline = reason not in (Reason.ARROL_PRUNED, Reason.DARTS_CANCELLED)
        marks.append(TrainingMark(keep=weight > 0, weight=weight, baseline=baseline,
                                  info=info, eps_kept=eps_kept))
    return marks


def mark_metrics(marks: Sequence[TrainingMark], prefix: str = "vllm_rl/") -> dict[str, float]:
    """Step metrics: samples by reason, kept, dropped, and the kept samples' mean weight."""
    n = max(len(marks), 1)
    kept = [m for m in marks if m.keep]
    out = {f"{prefix}ended/{reason}": count / n
           for reason, count in Counter(m.reason for m in marks).items()}
    out[f"{prefix}kept_fraction"] = len(kept) / n
    out[f"{prefix}dropped"] = float(len(marks) - len(kept))
    out[f"{prefix}mean_weight"] = sum(m.weight for m in kept) / max(len(kept), 1)
    return out
