"""``RLGRPOTrainer``: TRL's ``GRPOTrainer`` with each sample's loss weight on its advantage.

TRL's GRPO loss has no per-sample weight.  DUET's ε-kept samples need 1/ε (Eq. 6); the
PPO-clip surrogate is positively homogeneous in the advantage, so multiplying a sample's
advantage by its weight is the weighted loss.  The weights are those the
:class:`~vllm_rl.integrations.trl.rollout.RolloutFunc` returned for the same generation
batch, in TRL's order (one process; under several processes each process weights the
slice it generated, which is the slice TRL keeps).
"""
from __future__ import annotations

import torch
from trl import GRPOTrainer


class RLGRPOTrainer(GRPOTrainer):
    """``GRPOTrainer`` whose advantages carry the records' loss weights."""

    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        weights = getattr(self.rollout_func, "last_weights", None)
        if weights:
            w = torch.tensor(weights, dtype=out["advantages"].dtype,
                             device=out["advantages"].device)
            if w.shape == out["advantages"].shape:
                out["advantages"] = out["advantages"] * torch.where(w > 0, w, torch.ones_like(w))
        return out
