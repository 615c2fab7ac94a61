"""The verl trainer mode ``vllm_rl_sync``: verl's synchronous v1 trainer with the
records in the loss (``trainer.v1.trainer_mode=vllm_rl_sync``).

Two of verl's steps change (:mod:`.loss` says what each paper's estimator needs):

* before ``_balance_batch``: the records are read from TransferQueue
  (``extra_fields``); samples that leave the loss (DARTS not selected or cancelled,
  DUET aborted, ARRoL pruned, aborted) are cleared from TransferQueue and dropped from
  the step's batch, so verl pads the batch back to its required multiple and the
  log-prob recomputation, reference, critic and actor passes never compute them, and
  they leave the GRPO group baseline;
* after ``_compute_advantage``: advantages of samples with weight ≠ 1 (DUET's 1/ε)
  are multiplied by the weight.

With an ARRoL engine (``rollout.engine_kwargs.vllm_rl.arrol``) each step's records and
rewards also train the quality head and its calibration (:class:`.feedback.ArrolFeedback`),
pushed to every replica's server (``RLHttpServer.arrol_update``) before the next rollout.

Written against verl 0.9.1's ``PPOTrainer``; the pieces it uses (TransferQueue's
``kv_batch_get`` / ``kv_batch_put`` / ``kv_clear``, ``KVBatchMeta``) need a GPU trainer
to run, so this class is not run on the CPU: :mod:`.loss`, which decides everything, is
tested on real records.
"""
from __future__ import annotations

import ray
import transfer_queue as tq
from tensordict import TensorDict
from transfer_queue import KVBatchMeta
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

from vllm_rl.integrations.verl import TRAINER_MODE
from vllm_rl.integrations.verl.feedback import ArrolFeedback
from vllm_rl.integrations.verl.loss import mark_metrics, scale_rows, training_marks
from vllm_rl.integrations.verl.server import engine_settings


def kept_batch(batch: KVBatchMeta, keep: list[bool]) -> KVBatchMeta:
    """``batch`` with only the samples marked ``keep``."""
    idx = [i for i, k in enumerate(keep) if k]
    return KVBatchMeta(keys=[batch.keys[i] for i in idx], tags=[batch.tags[i] for i in idx],
                       partition_id=batch.partition_id, fields=batch.fields,
                       extra_info=batch.extra_info)


@register_trainer(TRAINER_MODE)
class RLTrainerSync(PPOTrainerSync):
    """``PPOTrainerSync`` whose loss follows each sample's vllm_rl record."""

    _weights: dict[str, float] = {}
    _feedback: ArrolFeedback | None = None

    def _balance_batch(self, batch, metrics, logging_prefix="global_seqlen", keep_minibatch=False):
        batch = self._apply_records(batch, metrics)
        return super()._balance_batch(batch, metrics, logging_prefix, keep_minibatch)

    def _apply_records(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id,
                               select_fields=["extra_fields", "rm_scores"])
        marks = training_marks(data.pop("extra_fields").tolist())
        metrics.update(mark_metrics(marks))
        rewards = [float(row.sum()) for row in data["rm_scores"].unbind()]
        self._push_arrol([m.info for m in marks], rewards)
        self._weights = {key: m.weight for key, m in zip(batch.keys, marks)
                         if m.keep and m.weight != 1.0}
        dropped = [key for key, m in zip(batch.keys, marks) if not m.keep]
        if not dropped:
            return batch
        tq.kv_clear(keys=dropped, partition_id=batch.partition_id)
        return kept_batch(batch, [m.keep for m in marks])

    def _compute_advantage(self, batch, metrics):
        batch = super()._compute_advantage(batch, metrics)
        keys = [key for key in batch.keys if key in self._weights]
        if keys:
            data = tq.kv_batch_get(keys=keys, partition_id=batch.partition_id,
                                   select_fields=["advantages"])
            scaled = scale_rows(data["advantages"], [self._weights[k] for k in keys])
            tq.kv_batch_put(keys=keys, partition_id=batch.partition_id,
                            fields=TensorDict({"advantages": scaled}, batch_size=len(keys)))
        return batch

    def _push_arrol(self, infos, rewards) -> None:
        settings = engine_settings(self.config.actor_rollout_ref.rollout)
        if not settings.get("arrol"):
            return
        if self._feedback is None:
            flags = (settings.get("flags") or {}).get("arrol") or {}
            self._feedback = ArrolFeedback(flags)
        update = self._feedback.observe(infos, rewards)
        if update is not None:
            replicas = self.llm_server_manager.rollout_replicas
            ray.get([r.server_handle.arrol_update.remote(**update) for r in replicas])
