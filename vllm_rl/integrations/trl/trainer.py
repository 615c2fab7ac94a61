"""``RLGRPOTrainer``: TRL's ``GRPOTrainer`` with each sample's loss weight on its advantage.

TRL's GRPO loss has no per-sample weight.  TRL computes the group-relative advantages
from the rewards :func:`~vllm_rl.integrations.trl.rollout.masked_reward` returns (``None``
outside the group baseline, so its group mean and std run over the baseline members);
this trainer then multiplies each advantage by the sample's loss weight from the
:class:`~vllm_rl.integrations.trl.rollout.RolloutFunc` of the same generation batch: 0
for a sample out of the loss (a DUET-aborted one counts in the baseline, Alg. A.10 l.38,
but its advantage is zeroed, l.39-40), 1/ε for DUET's ε-kept (Eq. 6; the PPO-clip
surrogate is positively homogeneous in the advantage, so this is the weighted loss), 1
otherwise.  One process; under several processes each process weights the slice it
generated, which is the slice TRL keeps.

TRL gives every prompt ``num_generations`` (M) rows.  A step's group may need more: a
DARTS group's M and, beside them, DUET's eps-kept samples (the composition rule), all in
the loss.  With a :class:`~vllm_rl.integrations.trl.rollout.RolloutFunc` this trainer
generates first (:meth:`RolloutFunc.prepare`) and gives every prompt of the step the
rows its largest group needs, so no sample in the loss or the baseline is ever cut;
smaller groups fill the extra rows with their unselected samples or padding rows, out
of the loss and the baseline.

With partial rollouts (``RolloutFunc(partial=...)``) each of TRL's checkpoints keeps the
carry buffer beside it (``vllm_rl_carry.json``), and a run resumed from one continues
every carried sample: none lost, none trained twice.

Every step it also logs the learning-signal diagnostics of
:func:`vllm_rl.integrations.common.advantages.step_diagnostics` as ``vllm_rl/<name>``
(samples in the loss per group, share of zero-advantage groups, effective sample size of
the advantages, share carried by 1/ε weights) and keeps them in :attr:`diagnostics`.
"""
from __future__ import annotations

import logging
import os

import torch
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from trl import GRPOTrainer

from vllm_rl.integrations.common.advantages import step_diagnostics
from vllm_rl.integrations.trl.rollout import RolloutFunc


class _OutOfBaselineNote(logging.Filter):
    """TRL warns, with the sample's every keyword, each time all reward functions return
    ``None`` for a sample; :func:`~vllm_rl.integrations.trl.rollout.masked_reward` does
    that on purpose for each sample outside its group baseline (``vllm_rl_baseline`` 0).
    Those warnings are dropped; any other stays."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = str(record.msg)
        return not ("All reward functions returned None" in msg
                    and "'vllm_rl_baseline': 0" in msg)


_FILTER = _OutOfBaselineNote()


class RLGRPOTrainer(GRPOTrainer):
    """``GRPOTrainer`` whose advantages carry the records' loss weights."""

    diagnostics: dict[str, float] = {}

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        log = logging.getLogger(GRPOTrainer.__module__)
        if _FILTER not in log.filters:
            log.addFilter(_FILTER)

    takes_slots = True      # RolloutFunc: groups may get more rows than num_generations

    def _generate_and_score_completions(self, inputs):
        rollout = self.rollout_func
        m = self.num_generations
        slots = m
        if isinstance(rollout, RolloutFunc) and self.model.training:
            # The step's groups may hold more samples in the loss or the baseline than
            # num_generations (DARTS's M and DUET's eps-kept beside them): generate first,
            # then give every prompt the rows its largest group needs.
            slots = rollout.prepare([x["prompt"] for x in inputs], self,
                                    multiple=self.args.steps_per_generation or 1, rows=inputs)
            if slots != m or rollout.partial is not None:
                inputs = rollout.inputs(inputs, slots)
        self.num_generations = slots
        try:
            out = super()._generate_and_score_completions(inputs)
        finally:
            self.num_generations = m
        weights = getattr(rollout, "last_weights", None)
        if weights:
            adv = out["advantages"]
            w = torch.tensor(weights, dtype=adv.dtype, device=adv.device)
            if w.shape[0] == adv.shape[0]:
                out["advantages"] = adv * w.view(-1, *([1] * (adv.dim() - 1)))
                marks = getattr(rollout, "last_marks", None) or []
                if len(marks) == len(weights):
                    a = out["advantages"]
                    flat = (a if a.dim() == 1 else a[:, 0]).tolist()
                    groups = [i // slots for i in range(len(flat))]
                    self.diagnostics = step_diagnostics(marks, flat, groups)
                    if isinstance(rollout, RolloutFunc):   # DUET's Phase 4, unweighted
                        raw = (adv if adv.dim() == 1 else adv[:, 0]).tolist()
                        rollout.observe_advantages(raw, slots)
                    mode = "train" if self.model.training else "eval"
                    for k, v in self.diagnostics.items():
                        self._metrics[mode][f"vllm_rl/{k}"].append(v)
        partial = getattr(rollout, "partial", None)
        if partial is not None and self.model.training:
            # Partial rollouts: how stale the step's samples are, and the loss's
            # correction for the weights their tokens came from (PartialConfig.loss).
            self.diagnostics = {**self.diagnostics, **rollout.last.staleness}
            for k, v in rollout.last.staleness.items():
                self._metrics["train"][f"vllm_rl/{k}"].append(v)
            if partial.loss == "tis" and "sampling_per_token_logps" in out:
                out["importance_sampling_ratio"] = self._tis_ratio(out, partial.tis_cap)
        return out

    # -- partial rollouts: the carry buffer in TRL's checkpoints -------------------------
    def _carry_buffer(self):
        rollout = self.rollout_func
        if isinstance(rollout, RolloutFunc) and rollout.partial is not None:
            return rollout.buffer
        return None

    def _save_checkpoint(self, model, trial) -> None:
        """TRL's checkpoint, and with partial rollouts the carried samples beside it
        (``vllm_rl_carry.json``): a run resumed from it continues every one of them, and
        none it trained before the checkpoint is in it."""
        super()._save_checkpoint(model, trial)
        buffer = self._carry_buffer()
        if buffer is not None and self.args.should_save:
            buffer.save(os.path.join(self._get_output_dir(trial=trial),
                                     f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"))

    def _load_optimizer_and_scheduler(self, checkpoint) -> None:
        """TRL's resume (every path runs this: plain, DeepSpeed, FSDP), and the carried
        samples the checkpoint kept in place of the buffer's (none kept: unchanged)."""
        super()._load_optimizer_and_scheduler(checkpoint)
        buffer = self._carry_buffer()
        if buffer is not None and checkpoint is not None:
            buffer.load(checkpoint)

    @torch.no_grad()
    def _tis_ratio(self, out: dict, cap: float) -> torch.Tensor:
        """Truncated importance sampling for partial rollouts, per token:
        ``min(pi_theta(t) / pi_rollout(t), cap)``, ``pi_rollout`` the logprob the engine
        sampled the token with (under the weights of its span), ``pi_theta`` this step's
        policy before its update (:func:`vllm_rl.integrations.common.partial.tis_weights`)."""
        current = out.get("old_per_token_logps")
        if current is None:
            ids = torch.cat([out["prompt_ids"], out["completion_ids"]], dim=1)
            mask = torch.cat([out["prompt_mask"], out["completion_mask"]], dim=1)
            current = self._get_per_token_logps_and_entropies(
                self.model, ids, mask, out["completion_ids"].size(1),
                batch_size=self.args.per_device_train_batch_size)[0]
        diff = (current - out["sampling_per_token_logps"]) * out["completion_mask"]
        return torch.clamp(torch.exp(torch.nan_to_num(diff, nan=0.0)), max=cap)

    def _compute_loss(self, model, inputs):
        """TRL's loss; with partial rollouts' ``tis`` the per-token ratio of
        :meth:`_tis_ratio` multiplies each token's loss, through TRL's own importance
        sampling term (which TRL applies to its vLLM paths only)."""
        if self.use_vllm or "importance_sampling_ratio" not in inputs:
            return super()._compute_loss(model, inputs)
        saved = self.use_vllm, self.vllm_importance_sampling_correction
        self.use_vllm = self.vllm_importance_sampling_correction = True
        try:
            return super()._compute_loss(model, inputs)
        finally:
            self.use_vllm, self.vllm_importance_sampling_correction = saved
