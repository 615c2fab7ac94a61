"""The verl trainer mode ``vllm_rl_sync``: verl's synchronous v1 trainer with the
records in the loss (``trainer.v1.trainer_mode=vllm_rl_sync``).

Two of verl's steps change (:mod:`.loss` says what each paper's estimator needs):

* before ``_balance_batch``: the records are read from TransferQueue
  (``extra_fields``); samples outside their group's baseline (DARTS not selected or
  cancelled, ARRoL pruned, aborted) are cleared from TransferQueue and dropped from the
  step's batch, so verl pads the batch back to its required multiple, the log-prob
  recomputation, reference, critic and actor passes never compute them, and they leave
  the GRPO group baseline; DUET-aborted samples stay, their reward in the baseline;
* after ``_compute_advantage``: advantages of samples with weight ≠ 1 are multiplied by
  the weight (DUET: 1/ε when kept at the gate, 0 when aborted), and the step's
  learning-signal diagnostics (:func:`~vllm_rl.integrations.common.advantages.step_diagnostics`)
  go to verl's metrics as ``vllm_rl/<name>``.

With an ARRoL engine (``rollout.engine_kwargs.vllm_rl.arrol``) each step's records and
rewards also train the quality head and its calibration
(:class:`vllm_rl.arrol.controller.ArrolFeedback`),
pushed to every replica's server (``RLHttpServer.arrol_update``) before the next rollout.
The hidden states the records name (``arrol.return_hidden``: kept on the replica that
ran the sample, the record carries its ``hidden_id``) are taken first, one
``RLHttpServer.arrol_hidden`` call per replica and step (:func:`fetch_hidden`).

verl branches on ``trainer_mode == "sync"`` for the synchronous semantics (its
``ReplayBuffer`` rather than ``ReplayBufferAsync``, whole ``gen_batch_size`` dataloader
fetches, no TransferQueue checkpoint); this mode is the sync trainer under another name,
so :attr:`RLTrainerSync.trainer_mode` reads ``"sync"``.

Written against verl 0.9.1's ``PPOTrainer`` and TransferQueue 0.1.11, and run on the CPU
(``tests/integrations/test_verl.py``): verl's own ``_step_once`` on a real TransferQueue filled by
verl's ``AgentLoopWorkerTQ`` from the RL engine, everything but the GPU worker groups
(log-prob recomputation in bypass mode, no actor update).
"""
from __future__ import annotations

import ray
import transfer_queue as tq
from tensordict import TensorDict
from transfer_queue import KVBatchMeta
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

from vllm_rl.integrations.common.advantages import step_diagnostics
from vllm_rl.arrol.controller import ArrolFeedback
from vllm_rl.integrations.verl import TRAINER_MODE
from vllm_rl.integrations.verl.loss import mark_metrics, scale_rows, training_marks
from vllm_rl.integrations.verl.server import engine_settings
from vllm_rl.outcome import hidden_ids, with_hidden


def rows(values) -> list:
    """One Python object per sample of a non-tensor field read from TransferQueue: a
    ``NonTensorStack`` (``TensorDict.pop``), tensordict's ``LinkedList`` (indexing) or a
    numpy array, as verl notes in ``_compute_reward_colocate``."""
    return values.tolist() if hasattr(values, "tolist") else list(values)


def fetch_hidden(infos: list, servers: list) -> list:
    """``infos`` with the hidden states they name, taken from the replicas' servers
    (``RLStateRPC.arrol_hidden``: each answers the ids it kept; one call per server)."""
    ids = hidden_ids(infos)
    if not ids:
        return infos
    found: dict = {}
    for part in ray.get([s.arrol_hidden.remote(ids) for s in servers]):
        found.update(part)
    return with_hidden(infos, found)


def kept_batch(batch: KVBatchMeta, keep: list[bool]) -> KVBatchMeta:
    """``batch`` with only the samples marked ``keep`` (tags, partition and batch info
    kept: TransferQueue's ``KVBatchMeta.select_keys``)."""
    return batch.select_keys([key for key, k in zip(batch.keys, keep) if k])


@register_trainer(TRAINER_MODE)
class RLTrainerSync(PPOTrainerSync):
    """``PPOTrainerSync`` whose loss follows each sample's vllm_rl record."""

    _weights: dict[str, float] = {}
    _marks: dict = {}
    _feedback: ArrolFeedback | None = None

    @property
    def trainer_mode(self) -> str:
        """``"sync"``: verl's checks for the synchronous trainer hold for this mode, and
        its settings are verl's ``trainer.v1.sync``."""
        return "sync"

    @trainer_mode.setter
    def trainer_mode(self, name: str) -> None:
        """``PPOTrainer.__init__`` sets the configured mode name (``vllm_rl_sync``)."""

    def _balance_batch(self, batch, metrics, logging_prefix="global_seqlen", keep_minibatch=False):
        batch = self._apply_records(batch, metrics)
        return super()._balance_batch(batch, metrics, logging_prefix, keep_minibatch)

    def _apply_records(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id,
                               select_fields=["extra_fields", "rm_scores"])
        marks = training_marks(rows(data.pop("extra_fields")))
        metrics.update(mark_metrics(marks))
        rewards = [float(row.sum()) for row in data["rm_scores"].unbind()]
        self._push_arrol([m.info for m in marks], rewards)
        # in the baseline but not the loss (DUET-aborted, Alg. A.10 l.38-40): stays for
        # verl's group mean, advantage × 0; outside the baseline: leaves the batch
        self._weights = {key: m.weight for key, m in zip(batch.keys, marks)
                         if m.baseline and m.weight != 1.0}
        self._marks = {key: m for key, m in zip(batch.keys, marks) if m.baseline}
        dropped = [key for key, m in zip(batch.keys, marks) if not m.baseline]
        if not dropped:
            return batch
        tq.kv_clear(keys=dropped, partition_id=batch.partition_id)
        return kept_batch(batch, [m.baseline for m in marks])

    def _compute_advantage(self, batch, metrics):
        batch = super()._compute_advantage(batch, metrics)
        keys = [key for key in batch.keys if key in self._weights]
        if keys:
            data = tq.kv_batch_get(keys=keys, partition_id=batch.partition_id,
                                   select_fields=["advantages"])
            scaled = scale_rows(data["advantages"], [self._weights[k] for k in keys])
            tq.kv_batch_put(keys=keys, partition_id=batch.partition_id,
                            fields=TensorDict({"advantages": scaled}, batch_size=len(keys)))
        self._diagnostics(batch, metrics)
        return batch

    def _diagnostics(self, batch, metrics: dict) -> None:
        """The step's diagnostics over the samples that carry records."""
        keys = [key for key in batch.keys if key in self._marks]
        if not keys:
            return
        data = tq.kv_batch_get(keys=keys, partition_id=batch.partition_id,
                               select_fields=["advantages"])
        adv = [float(row.reshape(-1)[0]) if row.numel() else 0.0
               for row in data["advantages"].unbind()]
        marks = [self._marks[k] for k in keys]
        groups = [m.info.group_id if m.info is not None else "stock" for m in marks]
        metrics.update({f"vllm_rl/{k}": v
                        for k, v in step_diagnostics(marks, adv, groups).items()})

    def _push_arrol(self, infos, rewards) -> None:
        settings = engine_settings(self.config.actor_rollout_ref.rollout)
        if not settings.get("arrol"):
            return
        if self._feedback is None:
            flags = (settings.get("flags") or {}).get("arrol") or {}
            self._feedback = ArrolFeedback(flags)
        replicas = self.llm_server_manager.rollout_replicas
        infos = fetch_hidden(infos, [r.server_handle for r in replicas])
        update = self._feedback.observe(infos, rewards)
        if update is not None:
            ray.get([r.server_handle.arrol_update.remote(**update) for r in replicas])
