"""From verl's ``extra_fields`` to what each paper's estimator needs in verl's loss.

verl's PPO loss (``workers/utils/losses.py::ppo_loss``) sees masks, log-probs and
advantages.  :func:`training_marks` reads each sample's record and flags (the server's
``extra_fields["vllm_rl"]``, the agent loop's ``extra_fields["vllm_rl_flags"]``) and
applies the shared rules of :mod:`vllm_rl.integrations.common.marks`: per sample, whether
it is in the loss, its weight, and whether its reward counts in its group's baseline
(DARTS's selected M; every DUET rollout, aborted ones included, Alg. A.10 l.38; never
an ARRoL-pruned one).  The trainer mode (:mod:`.trainer`) drops the samples outside the
baseline before verl's balancing, so verl pads the batch back to its required multiple
and the log-prob recomputation, reference and actor passes never see them; a sample in
the baseline but not in the loss (DUET-aborted) stays for verl's group mean and gets its
advantage multiplied by 0 (l.39-40), and DUET's ε-kept ones by 1/ε.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from vllm_rl.integrations.common.marks import TrainingMark, mark_metrics
from vllm_rl.integrations.common.marks import training_marks as _marks
from vllm_rl.integrations.verl.keys import FLAGS_KEY, RECORD_KEY
from vllm_rl.outcome import RolloutInfo

__all__ = ["TrainingMark", "mark_metrics", "scale_rows", "training_marks"]


def training_marks(extra_fields: Sequence[Mapping[str, Any] | None]) -> list[TrainingMark]:
    """One :class:`TrainingMark` per sample from verl's ``extra_fields`` (groups
    annotated whole)."""
    fields = [f or {} for f in extra_fields]
    return _marks([RolloutInfo.decode(f.get(RECORD_KEY)) for f in fields],
                  [f.get(FLAGS_KEY) for f in fields])


def scale_rows(values, weights: Sequence[float]):
    """``values`` (a padded ``[batch, length]`` tensor or a jagged nested tensor, one
    row per sample) with row i multiplied by ``weights[i]``."""
    import torch

    w = torch.as_tensor(list(weights), dtype=torch.float32)
    if getattr(values, "is_nested", False):
        rows = [row * w[i].to(row.dtype) for i, row in enumerate(values.unbind())]
        return torch.nested.nested_tensor(rows, layout=values.layout)
    return values * w.to(values.dtype).view(-1, *([1] * (values.dim() - 1)))
