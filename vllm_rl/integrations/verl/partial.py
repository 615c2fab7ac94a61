"""Partial rollouts on verl: ``rollout.engine_kwargs.vllm_rl.partial`` (APRIL across
verl's replicas).

The setting is :class:`~vllm_rl.integrations.common.partial.PartialConfig`'s (a mapping,
or ``true`` for its defaults), read by the trainer mode ``vllm_rl_sync``
(:mod:`.trainer`).  Each step:

1. **launch** (:meth:`PartialRollouts.launch`, in ``prepare_step``): the groups carried
   from earlier steps go first, then the dataloader's prompts.  A carried group is one
   verl prompt row under its own ``uid`` with ``__rollout_n__`` = its M' members (verl's
   per-row sample count) and ``vllm_rl_carry``: its prompt ids, flags and members.
   The members that already ended are returned as they are, with no request.  The
   carried ones continue as continuations
   (:func:`~vllm_rl.integrations.common.partial.continuation`).  Every new row carries
   the step's ``partial`` flags in ``vllm_rl_partial``.  The agent loop
   (:mod:`.agent_loop`) reads both.
2. **end** (:class:`PartialSampling`, verl's replay buffer wrapped): no engine sees every
   group of a step (the router spreads the groups over the replicas), so the trainer
   counts the groups finished in TransferQueue.  Once ``ceil(launched / over)`` are
   (or ``time_s`` has passed with one), it ends the step on every replica (``RLHttpServer.end_step``: the engine-core
   utility ``vllm_rl_end_step``).  The samples still generating come back ``carried``,
   and verl's replay buffer then takes every launched group.
3. **split** (:meth:`PartialRollouts.split`, in the trainer's ``_apply_records``): a group
   with a carried member goes back into the buffer (its rows leave TransferQueue and the
   batch); the others train, whole, whatever step each of their samples started in.

The loss: ``loss="as_is"`` (APRIL) takes the samples as they are; ``loss="tis"`` is verl's
own token-level truncated importance sampling (``algorithm.rollout_correction.rollout_is
= token``, ``rollout_is_threshold`` = ``tis_cap``, over each token's rollout logprob,
which a continuation row carries for its earlier tokens too).  The trainer checks that
verl is configured so.  A checkpoint keeps the buffer (``vllm_rl_carry.json`` beside
verl's ``data.pt``).  A resume that finds none drops nothing silently: there was
nothing carried.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from vllm_rl.integrations.common.partial import (
    CHECKPOINT_FILE,
    CarriedGroup,
    CarryBuffer,
    Part,
    PartialConfig,
    continuation,
)
from vllm_rl.outcome import Reason, RolloutInfo

CARRY_KEY = "vllm_rl_carry"          # a carried group's row: prompt ids, flags, members
RULE_KEY = "vllm_rl_partial"         # a new prompt's row: the step's partial flags (JSON)
ROLLOUT_N = "__rollout_n__"          # verl's per-row sample count (AgentLoopWorkerTQ)
TENSORS = "__vllm_rl_tensors__"      # a kept row's fields that were tensors


def _plain(value: Any) -> Any:
    """``value`` in JSON's types (numpy scalars and arrays, tuples, nested)."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    elif hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def rows_of(batch) -> list[dict]:
    """A verl prompt batch (the dataloader's ``TensorDict``) as one JSON-able dict per
    row, its tensor fields as lists (named under ``__vllm_rl_tensors__``); batch-wide
    values (``global_steps``) are set again when the rows are sent."""
    import torch
    from tensordict import NonTensorStack

    rows: list[dict] = [{} for _ in range(len(batch))]
    tensors = []
    for key, value in batch.items():
        if isinstance(value, torch.Tensor):
            tensors.append(key)
            for i, row in enumerate(rows):
                row[key] = value[i].tolist()
        elif isinstance(value, NonTensorStack):
            for i, row in enumerate(rows):
                row[key] = _plain(value[i].data)
    for row in rows:
        row[TENSORS] = list(tensors)
    return rows


def batch_of(rows: Sequence[dict], step: int):
    """The rows as the ``TensorDict`` verl's agent loop workers take (:func:`rows_of`
    inverted), at ``global_steps`` = ``step``."""
    import torch
    from verl.utils import tensordict_utils as tu

    keys: list[str] = []
    for row in rows:
        keys += [k for k in row if k != TENSORS and k not in keys]
    tensors = {k for row in rows for k in row.get(TENSORS, ())}
    columns = {k: torch.tensor([row[k] for row in rows]) if k in tensors
               else [row.get(k) for row in rows] for k in keys}
    batch = tu.get_tensordict(columns)
    tu.assign_non_tensor_data(batch, "global_steps", step)
    return batch


@dataclass
class Launched:
    """One step as launched: its rows' uids and the finished groups that end it."""

    step: int
    uids: set[str]
    need: int
    started: float = field(default_factory=time.monotonic)
    ended: bool = False


@dataclass
class StoredSample:
    """One sample of a step as verl put it into TransferQueue."""

    key: str
    uid: str
    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    info: RolloutInfo | None
    flags: dict | None


class PartialRollouts:
    """The trainer's side of partial rollouts on verl (module docstring)."""

    def __init__(self, cfg: PartialConfig, n: int, max_tokens: int) -> None:
        self.cfg, self.n, self.max_tokens = cfg, n, max_tokens
        self.buffer = CarryBuffer()
        self.rows: dict[str, dict] = {}          # uid → its row, the groups launched
        self.launched: Launched | None = None

    def launch(self, step: int, batch) -> Any:
        """Step ``step``'s rows: the carried groups (oldest first), then ``batch``."""
        going, done = self.buffer.take(step, self.cfg.max_staleness)
        fresh = rows_of(batch)
        samples = sum(len(g.carried) for g in going) + self.n * len(fresh)
        rule = self.cfg.rule(step, len(going) + len(fresh), samples, self.max_tokens,
                             by_engine=False)
        rows = [self._carry_row(g, step, rule) for g in going + done]
        for row in fresh:
            row.update({CARRY_KEY: "", RULE_KEY: json.dumps(rule), ROLLOUT_N: self.n})
        rows += fresh
        self.rows = {str(row["uid"]): row for row in rows}
        # a group all of whose carried samples were dropped (the cap) is complete now
        self.launched = Launched(step, set(self.rows),
                                 self.cfg.need(len(going) + len(fresh)) + len(done))
        return batch_of(rows, step)

    def _carry_row(self, group: CarriedGroup, step: int, rule: dict) -> dict:
        members: list[dict] = [{"part": p.to_json()} for p in group.ended]
        for part in group.carried:
            ids, flags, left, seed = continuation(group, part, step, rule, self.max_tokens)
            members.append({"part": part.to_json(), "prompt_ids": ids, "flags": flags,
                            "max_tokens": left, "seed": seed})
        row = dict(group.row)
        row.update({CARRY_KEY: json.dumps({"prompt_ids": group.prompt_ids,
                                           "flags": group.flags, "members": members}),
                    RULE_KEY: "", ROLLOUT_N: len(members)})
        return row

    def split(self, samples: Sequence[StoredSample]) -> list[bool]:
        """Which of the step's samples train now: a group (a row's ``uid``) with a
        carried member goes back into the buffer, whole; the others stay.  The buffer
        changes here, once, when every group has been read
        (:meth:`~vllm_rl.integrations.common.partial.CarryBuffer.commit`): until then
        (:meth:`launch` took copies) it holds every carried sample, so an error between
        the two loses none."""
        step = self.launched.step if self.launched is not None else 0
        by_uid: dict[str, list[StoredSample]] = {}
        for s in samples:
            by_uid.setdefault(s.uid, []).append(s)
        carried: set[str] = set()
        back: list[CarriedGroup] = []
        for uid, group in by_uid.items():
            if not any(s.info is not None and s.info.reason is Reason.CARRIED for s in group):
                continue
            carried.add(uid)
            flags = next((s.flags for s in group if s.flags), None) or {}
            flags = {k: v for k, v in flags.items() if k != "partial"}
            parts = [Part(s.token_ids, s.logprobs, s.info) for s in group]
            info = next(s.info for s in group if s.info is not None)
            g = CarriedGroup(
                prompt=uid, prompt_ids=group[0].prompt_ids, flags=flags,
                group_id=info.group_id or uid,
                size=int((flags.get("group") or {}).get("size") or len(group)),
                redundant=len(group),
                start_step=min((p.info.start_step for p in parts
                                if p.info is not None and p.info.start_step is not None),
                               default=step),
                row={k: v for k, v in self.rows.get(uid, {}).items()
                     if k not in (CARRY_KEY, RULE_KEY, ROLLOUT_N)})
            for p in parts:
                g.add(p)
            back.append(g)
        self.buffer.commit(back)            # all or nothing: the step's results are in
        return [s.uid not in carried for s in samples]

    def state_dict(self) -> dict:
        return self.buffer.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.buffer.load_state_dict(state)


class PartialSampling:
    """verl's replay buffer, the step's end added: :meth:`sample` waits for ``need`` of
    the launched groups to finish, ends the step on every replica (``end``), then lets
    verl's buffer take every launched group (all end now: finished, or carried).  Any
    other attribute is the buffer's."""

    def __init__(self, inner: Any, partial: PartialRollouts,
                 end: Callable[[int], Any]) -> None:
        self.inner, self.partial, self.end = inner, partial, end

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def sample(self, global_steps: int, partition_id: str, batch_size: int):
        launched = self.partial.launched
        if partition_id != "train" or launched is None:
            return self.inner.sample(global_steps=global_steps, partition_id=partition_id,
                                     batch_size=batch_size)
        inner, limit = self.inner, self.partial.cfg.time_s
        while not launched.ended:
            inner._sync_metadata_from_transfer_queue()
            done = len((inner.finished_keys[partition_id] | inner.failure_keys[partition_id])
                       & launched.uids)
            late = limit is not None and time.monotonic() - launched.started >= limit
            if done >= launched.need or (done and late):
                self.end(launched.step)
                launched.ended = True
            else:
                time.sleep(inner.poll_interval)        # verl's own poll
        return inner.sample(global_steps=global_steps, partition_id=partition_id,
                            batch_size=len(launched.uids))


@dataclass
class CarryPayload:
    """A carried group's row as the agent loop reads it (``vllm_rl_carry``)."""

    prompt_ids: list[int]
    flags: dict | None
    members: list[dict] = field(default_factory=list)

    @classmethod
    def of(cls, raw: str | None) -> "CarryPayload | None":
        if not raw:
            return None
        d = json.loads(raw)
        return cls(list(d["prompt_ids"]), d.get("flags"), list(d["members"]))


def check_tis(config, cfg: PartialConfig) -> None:
    """``partial.loss="tis"`` is verl's own token-level truncated importance sampling
    over each token's rollout logprob: refuse a configuration that would not run it."""
    rc = config.algorithm.get("rollout_correction", None) or {}
    want = {"algorithm.rollout_correction.rollout_is": "token",
            "algorithm.rollout_correction.rollout_is_threshold": cfg.tis_cap,
            "actor_rollout_ref.rollout.calculate_log_probs": True}
    got = {"algorithm.rollout_correction.rollout_is": rc.get("rollout_is"),
           "algorithm.rollout_correction.rollout_is_threshold": _float(
               rc.get("rollout_is_threshold")),
           "actor_rollout_ref.rollout.calculate_log_probs": bool(
               config.actor_rollout_ref.rollout.get("calculate_log_probs"))}
    wrong = {k: got[k] for k in want if got[k] != want[k]}
    if wrong:
        raise ValueError("rollout.engine_kwargs.vllm_rl.partial.loss=tis runs verl's "
                         "token-level TIS; set " + ", ".join(f"{k}={want[k]}" for k in wrong)
                         + f" (found {wrong})")


def _float(value):
    try:
        return float(value)
    except (TypeError, ValueError):
        return value


def checkpoint_folder(config, step: int) -> str:
    """The ``global_step_{step}`` folder verl resumed from (``resume_from_path``, else
    under ``default_local_dir``)."""
    trainer = config.trainer
    if trainer.get("resume_mode") == "resume_path" and trainer.get("resume_from_path"):
        folder = trainer.resume_from_path
    else:
        folder = os.path.join(trainer.default_local_dir, f"global_step_{step}")
    return folder if os.path.isabs(folder) else os.path.join(os.getcwd(), folder)


__all__ = ["CARRY_KEY", "CHECKPOINT_FILE", "CarryPayload", "Launched", "PartialRollouts",
           "PartialSampling", "RULE_KEY", "StoredSample", "batch_of", "check_tis",
           "checkpoint_folder", "rows_of"]
