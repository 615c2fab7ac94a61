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

With partial rollouts (``rollout.engine_kwargs.vllm_rl.partial``, :mod:`.partial`) each
step launches the carried groups and the dataloader's prompts, ends once enough groups
have finished (on every replica), carries the groups with unfinished samples into the
next step (out of this step's batch) and trains the complete ones; their staleness goes
to verl's metrics (``vllm_rl/staleness_mean`` ...), and the buffer into each checkpoint.

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

import json
import os

import ray
import transfer_queue as tq
from tensordict import TensorDict
from transfer_queue import KVBatchMeta
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

from vllm_rl.arrol.controller import ArrolFeedback
from vllm_rl.flags import read_step
from vllm_rl.integrations.common.advantages import step_diagnostics
from vllm_rl.integrations.common.partial import Part, PartialConfig, staleness
from vllm_rl.integrations.verl.keys import FLAGS_KEY, RECORD_KEY, TRAINER_MODE
from vllm_rl.integrations.verl.loss import mark_metrics, scale_rows, training_marks
from vllm_rl.integrations.verl.partial import (
    PartialRollouts,
    PartialSampling,
    StoredSample,
    check_tis,
    checkpoint_folder,
)
from vllm_rl.integrations.verl.server import engine_settings
from vllm_rl.outcome import RolloutInfo, hidden_ids, with_hidden


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
    partial: PartialRollouts | None = None

    @property
    def trainer_mode(self) -> str:
        """``"sync"``: verl's checks for the synchronous trainer hold for this mode, and
        its settings are verl's ``trainer.v1.sync``."""
        return "sync"

    @trainer_mode.setter
    def trainer_mode(self, name: str) -> None:
        """``PPOTrainer.__init__`` sets the configured mode name (``vllm_rl_sync``)."""

    # -- partial rollouts ------------------------------------------------------------
    def _build_replay_buffer(self):
        buffer = super()._build_replay_buffer()
        rollout = self.config.actor_rollout_ref.rollout
        cfg = PartialConfig.of(engine_settings(rollout).get("partial"))
        if cfg is None:
            return buffer
        if self.parameter_sync_step != 1:
            raise ValueError("rollout.engine_kwargs.vllm_rl.partial: one rollout per weight "
                             f"sync (trainer.v1.sync.parameter_sync_step=1, got "
                             f"{self.parameter_sync_step})")
        if cfg.loss == "tis":
            check_tis(self.config, cfg)
        self.partial = PartialRollouts(cfg, int(rollout.n), int(rollout.response_length))
        return PartialSampling(buffer, self.partial, self._end_step)

    def _end_step(self, step: int) -> None:
        """End ``step`` on every replica (``RLHttpServer.end_step``)."""
        step = read_step(step)             # refused here, before any replica sees it
        replicas = self.llm_server_manager.rollout_replicas
        ray.get([r.server_handle.end_step.remote(step) for r in replicas])

    def prepare_step(self) -> dict:
        if self.partial is None:
            return super().prepare_step()
        batch = self.partial.launch(self.global_steps, self._next_train_batch())
        self._submit_batch_to_rollout(batch)
        return {}

    def _carry(self, batch: KVBatchMeta, extra: list, metrics: dict) -> list[bool]:
        """Partial rollouts: the groups with a carried sample go back into the buffer
        (their rows leave TransferQueue and the batch); which samples stay."""
        logged = bool(self.config.actor_rollout_ref.rollout.get("calculate_log_probs"))
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id,
                               select_fields=["uid", "prompts", "responses"]
                               + (["rollout_log_probs"] if logged else []))
        uids, prompts = rows(data["uid"]), data["prompts"].unbind()
        responses = data["responses"].unbind()
        logprobs = (data["rollout_log_probs"].unbind() if logged
                    else [None] * len(responses))
        samples = []
        for key, uid, p, r, lp, e in zip(batch.keys, uids, prompts, responses, logprobs,
                                         extra):
            e = e or {}
            flags = e.get(FLAGS_KEY)
            samples.append(StoredSample(key, str(uid), p.tolist(), r.tolist(),
                                        lp.tolist() if lp is not None else [0.0] * r.numel(),
                                        RolloutInfo.decode(e.get(RECORD_KEY)),
                                        json.loads(flags) if flags else None))
        stay = self.partial.split(samples)
        trained = [Part(s.token_ids, s.logprobs, s.info) for s, k in zip(samples, stay)
                   if k and s.info is not None]
        metrics.update({f"vllm_rl/{k}": v for k, v in staleness(trained).items()})
        metrics["vllm_rl/carried_groups"] = len(self.partial.buffer)
        metrics["vllm_rl/carried_samples"] = self.partial.buffer.samples()
        return stay

    def _save_checkpoint(self):
        super()._save_checkpoint()
        if self.partial is not None:
            self.partial.buffer.save(os.path.join(self.config.trainer.default_local_dir,
                                                  f"global_step_{self.global_steps}"))

    def _load_checkpoint(self):
        out = super()._load_checkpoint()
        if self.partial is not None and self.global_steps:
            self.partial.buffer.load(checkpoint_folder(self.config, self.global_steps))
        return out

    # -- the records into the loss ------------------------------------------------------
    def _balance_batch(self, batch, metrics, logging_prefix="global_seqlen", keep_minibatch=False):
        batch = self._apply_records(batch, metrics)
        return super()._balance_batch(batch, metrics, logging_prefix, keep_minibatch)

    def _apply_records(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id,
                               select_fields=["extra_fields", "rm_scores"])
        extra = rows(data.pop("extra_fields"))
        rewards = [float(row.sum()) for row in data["rm_scores"].unbind()]
        if self.partial is not None:
            stay = self._carry(batch, extra, metrics)
            if not all(stay):
                tq.kv_clear(keys=[k for k, s in zip(batch.keys, stay) if not s],
                            partition_id=batch.partition_id)
                batch = kept_batch(batch, stay)
                extra = [e for e, s in zip(extra, stay) if s]
                rewards = [r for r, s in zip(rewards, stay) if s]
        marks = training_marks(extra)
        metrics.update(mark_metrics(marks))
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
