"""From records to what each paper's estimator needs in verl's loss.

verl's PPO loss (``workers/utils/losses.py::ppo_loss``) sees masks, log-probs and
advantages.  :func:`training_marks` reads each sample's record and flags (the server's
``extra_fields["vllm_rl"]``, the agent loop's ``extra_fields["vllm_rl_flags"]``) and
says, per sample, whether it enters the loss and with which weight:

* **DARTS** (Alg. 2, Sec. 4.1.2): the samples of a group are annotated together
  (:func:`vllm_rl.outcome.annotate_group`): early stop keeps the M shortest valid
  samples, dual-end the K shortest and L longest; the rest (cancelled, or valid but not
  selected) leave the loss *and* the group baseline.
* **DUET** (Eq. 6): a sample kept at the gate with probability ε has weight 1/ε; an
  aborted one weight 0.  The weight multiplies the sample's advantage: the clipped PPO
  surrogate is positively homogeneous in the advantage, so this is the weighted loss.
* **ARRoL** (Sec. 4.2): a pruned sample has weight 0 and leaves the batch.
* A sample aborted by verl itself (reason ``abort``, or flags and no record: aborted
  before its first token) leaves the loss.

Samples that leave are dropped from the batch before verl's balancing, so verl pads the
batch back to its required multiple and the log-prob recomputation, reference and
actor passes never see them (the trainer mode in :mod:`.trainer`).  A sample without a
record (no flags) keeps weight 1.
"""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

from vllm_rl.flags import normalize, parse
from vllm_rl.integrations.verl import FLAGS_KEY, RECORD_KEY
from vllm_rl.outcome import Reason, RolloutInfo, annotate_group


@dataclass(frozen=True)
class TrainingMark:
    """Whether a sample enters the loss, and its loss weight (0 when it does not)."""

    keep: bool
    weight: float
    info: RolloutInfo | None = None

    @property
    def reason(self) -> str:
        if self.info is not None:
            return self.info.reason.value
        return "stock" if self.keep else Reason.ABORT.value


def _record(fields: Mapping[str, Any] | None) -> tuple[RolloutInfo | None, dict | None]:
    fields = fields or {}
    info = RolloutInfo.decode(fields.get(RECORD_KEY))
    raw = fields.get(FLAGS_KEY)
    flags = json.loads(raw) if isinstance(raw, str) else raw
    return info, flags


def training_marks(extra_fields: Sequence[Mapping[str, Any] | None]) -> list[TrainingMark]:
    """One :class:`TrainingMark` per sample (module docstring), groups annotated whole."""
    records = [_record(f) for f in extra_fields]
    infos: list[RolloutInfo | None] = [info for info, _ in records]
    groups: dict[str, list[int]] = {}
    for i, (info, flags) in enumerate(records):
        if info is not None and flags and flags.get("darts") is not None and info.group_id:
            groups.setdefault(info.group_id, []).append(i)
    for gid, members in groups.items():
        typed = parse(normalize(records[members[0]][1], n=1, default_group_id=gid))
        early = typed.darts.early_stop(typed.group)
        marked = annotate_group([infos[i] for i in members], typed.group.size,
                                typed.darts.k, early)
        for i, info in zip(members, marked):
            infos[i] = info
    marks = []
    for info, (_, flags) in zip(infos, records):
        if info is None:         # no flags: stock; flags but no record: aborted unstarted
            marks.append(TrainingMark(keep=not flags, weight=0.0 if flags else 1.0))
            continue
        weight = 0.0 if info.reason is Reason.ABORT else float(info.weight)
        if info.reason is Reason.ABORT:
            info = replace(info, weight=0.0)
        marks.append(TrainingMark(keep=weight > 0, weight=weight, info=info))
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


def scale_rows(values, weights: Sequence[float]):
    """``values`` (a padded ``[batch, length]`` tensor or a jagged nested tensor, one
    row per sample) with row i multiplied by ``weights[i]``."""
    import torch

    w = torch.as_tensor(list(weights), dtype=torch.float32)
    if getattr(values, "is_nested", False):
        rows = [row * w[i].to(row.dtype) for i, row in enumerate(values.unbind())]
        return torch.nested.nested_tensor(rows, layout=values.layout)
    return values * w.to(values.dtype).view(-1, *([1] * (values.dim() - 1)))
