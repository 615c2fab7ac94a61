"""From records to what OpenRLHF's experience and loss can use.

OpenRLHF turns each response dict of the rollout actor into an ``Experience``
(``SamplesGenerator._process_response_into_experience``): ``action_mask`` from the
response's ``action_ranges``, one reward per sample, and ``info`` from ``extra_logs``
(numbers only; other keys of the dict are dropped).  Its loss (``PolicyLoss`` →
``aggregate_loss``) reads the advantages and ``action_mask`` only, and a row whose mask is
all zero counts neither as tokens nor as a sample.  So, per sample (the marks of
:func:`vllm_rl.integrations.common.marks.training_marks`, groups annotated whole for DARTS):

* **leaves the loss** (DARTS cancelled or unselected, DUET aborted, ARRoL pruned,
  aborted): :func:`attach` empties its ``action_ranges`` → ``action_mask`` all zero (its
  tokens stay in the sequence, so OpenRLHF's ``(-1, n_samples_per_prompt)`` reward
  reshape still finds every sample of the group);
* **its record** reaches ``Experience.info`` through ``extra_logs``:
  ``vllm_rl/weight`` (loss weight), ``vllm_rl/keep`` (1 or 0), ``vllm_rl/baseline`` (1 if
  its reward counts in the group baseline: DUET's aborted ones do, Alg. A.10 l.38),
  ``vllm_rl/early`` (ended early by a technique), ``vllm_rl/length`` (tokens generated); the response dict also
  carries the record's wire string (``"vllm_rl"``) and the flags (``"vllm_rl_flags"``)
  for an executor or a reward function of your own, and with ARRoL's ``return_hidden``
  the hidden state at ``l_detect`` (``"vllm_rl_hidden"``: a float32 numpy vector taken
  from the workers, for an :class:`~vllm_rl.arrol.controller.ArrolFeedback`).

**A fractional weight** (DUET's 1/ε) cannot go through the mask: OpenRLHF builds
``action_mask`` as 0/1 from the ranges and also divides by its sum (token and sample
means), so a weight there would also change the normalisation.  What it needs is the
sample's advantage multiplied by the weight after the advantages are computed (the clipped
PPO surrogate is positively homogeneous in the advantage, so this is the weighted loss),
and for a sample that leaves the loss, its reward kept out of the group baseline.
:func:`patch_experience_maker` provides both without forking: it wraps
``RemoteExperienceMaker.compute_advantages_and_returns`` with :func:`before_advantages`
(the reward of each sample outside the baseline is set to the mean reward of its group's
baseline samples, which leaves that mean unchanged) and
:func:`after_advantages` (each group's advantages rescaled to the baseline-only estimator
where the imputation changed the scale: ``rloo`` by (k/(k−1))/(n/(n−1)), ``group_norm``
by sqrt((k−1)/(n−1)), k baseline samples of n; ``reinforce_baseline`` and ``dr_grpo`` are exact as
they stand; then every advantage multiplied by its sample's weight).  A group with fewer
than two kept samples under ``rloo`` / ``group_norm`` gets zero advantages (no baseline).
"""
from __future__ import annotations

import functools
import json
from typing import Any, Sequence

from vllm_rl.integrations.openrlhf import FLAGS_KEY, HIDDEN_KEY, RECORD_KEY
from vllm_rl.outcome import RolloutInfo

WEIGHT = "vllm_rl/weight"
KEEP = "vllm_rl/keep"
BASELINE = "vllm_rl/baseline"
EARLY = "vllm_rl/early"
LENGTH = "vllm_rl/length"
_WRAPPED = "__vllm_rl_wrapped__"


def attach(responses: list[dict], infos: Sequence[RolloutInfo | None],
           flags: dict | None) -> list[dict]:
    """Put each sample's record, flags, hidden state (if taken) and marks into its
    response dict (in place; the samples of one ``generate_responses`` call are one
    group)."""
    from vllm_rl.integrations.common.marks import training_marks

    wire = json.dumps(flags, sort_keys=True) if flags is not None else None
    for response, mark in zip(responses, training_marks(infos, [flags] * len(infos))):
        response[RECORD_KEY] = mark.info.encode() if mark.info is not None else None
        response[FLAGS_KEY] = wire
        response[HIDDEN_KEY] = mark.info.hidden_state() if mark.info is not None else None
        logs = dict(response.get("extra_logs") or {})
        logs[WEIGHT] = float(mark.weight)
        logs[KEEP] = 1.0 if mark.keep else 0.0
        logs[BASELINE] = 1.0 if mark.baseline else 0.0
        logs[EARLY] = 1.0 if mark.info is not None and mark.info.reason.early else 0.0
        logs[LENGTH] = float(mark.info.length) if mark.info is not None else 0.0
        response["extra_logs"] = logs
        if not mark.keep:
            response["action_ranges"] = []
    return responses


def _per_sample(experiences, key: str):
    """``info[key]`` of every sample in original order (``experience.index``), or None."""
    import torch

    if not experiences or any(key not in e.info for e in experiences):
        return None
    index = torch.tensor([i for e in experiences for i in e.index])
    values = torch.cat([e.info[key].reshape(-1).float() for e in experiences])
    out = torch.empty_like(values)
    out[index] = values
    return out


def _scatter(experiences, values) -> list:
    index = [list(e.index) for e in experiences]
    return [values[i] for i in index]


def before_advantages(experiences, n: int) -> Any:
    """Set the reward of each sample outside its group's baseline to the mean of the
    baseline samples (groups: ``n`` consecutive samples in original order).  Returns the
    state :func:`after_advantages` needs (None when the batch carries no records)."""
    import torch

    keep = _per_sample(experiences, BASELINE)
    if keep is None:
        keep = _per_sample(experiences, KEEP)
    if keep is None:
        return None
    rewards = torch.cat([e.rewards.reshape(-1).float() for e in experiences])
    index = torch.tensor([i for e in experiences for i in e.index])
    ordered = torch.empty_like(rewards)
    ordered[index] = rewards
    grid, kept = ordered.view(-1, n).clone(), keep.view(-1, n) > 0
    count = kept.sum(-1, keepdim=True)
    mean = (grid * kept).sum(-1, keepdim=True) / count.clamp(min=1)
    grid = torch.where(kept, grid, mean.expand_as(grid))
    flat = grid.reshape(-1)
    for e, rows in zip(experiences, _scatter(experiences, flat)):
        e.rewards = rows.to(e.rewards.dtype).reshape(e.rewards.shape)
    return {"kept": count.reshape(-1)}


def after_advantages(experiences, state: Any, n: int, estimator: str) -> None:
    """Rescale each group's advantages to the kept-only estimator and multiply every
    advantage by its sample's weight (in place)."""
    import torch

    if state is None:
        return
    weight = _per_sample(experiences, WEIGHT)
    k = state["kept"].float()
    scale = torch.ones_like(k)
    if n > 1 and estimator == "rloo":
        scale = torch.where(k > 1, (k / (k - 1).clamp(min=1)) / (n / (n - 1)),
                            torch.zeros_like(k))
    elif n > 1 and estimator == "group_norm":
        scale = torch.where(k > 1, ((k - 1).clamp(min=0) / (n - 1)).sqrt(), torch.zeros_like(k))
    per_sample = (weight.view(-1, n) * scale.view(-1, 1)).reshape(-1)
    for e, w in zip(experiences, _scatter(experiences, per_sample)):
        w = w.to(e.advantages.dtype).view(-1, *([1] * (e.advantages.dim() - 1)))
        e.advantages = e.advantages * w
    _diagnostics(experiences, n)


def _diagnostics(experiences, n: int) -> None:
    """The step diagnostics (:func:`vllm_rl.integrations.common.advantages.step_diagnostics`)
    into every sample's ``info`` as ``vllm_rl/diag/<name>``: OpenRLHF logs the batch mean of
    each info key, and each sample carries the batch's value, so the logged figure is it."""
    import torch

    from vllm_rl.integrations.common.advantages import step_diagnostics
    from vllm_rl.integrations.common.marks import TrainingMark

    keep, weight = _per_sample(experiences, KEEP), _per_sample(experiences, WEIGHT)
    base = _per_sample(experiences, BASELINE)
    index = torch.tensor([i for e in experiences for i in e.index])
    adv = torch.cat([e.advantages.reshape(e.advantages.shape[0], -1)[:, 0].float()
                     for e in experiences])
    ordered = torch.empty_like(adv)
    ordered[index] = adv
    marks = [TrainingMark(keep=bool(k), weight=float(w), baseline=bool(b),
                          eps_kept=bool(k) and float(w) > 1.0)
             for k, w, b in zip(keep.tolist(), weight.tolist(),
                                (base if base is not None else keep).tolist())]
    diag = step_diagnostics(marks, ordered.tolist(), [i // n for i in range(len(marks))])
    for e in experiences:
        size = len(e.index)
        for name, value in diag.items():
            e.info[f"vllm_rl/diag/{name}"] = torch.full((size,), float(value))


def patch_experience_maker(maker_cls=None) -> None:
    """Wrap ``RemoteExperienceMaker.compute_advantages_and_returns`` (idempotent)."""
    if maker_cls is None:
        from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker

        maker_cls = RemoteExperienceMaker
    original = maker_cls.compute_advantages_and_returns
    if getattr(original, _WRAPPED, False):
        return

    @functools.wraps(original)
    def compute_advantages_and_returns(self, experiences):
        import torch

        n = self.args.rollout.n_samples_per_prompt
        with torch.no_grad():
            for e in experiences:          # OpenRLHF does this first too (float32 at least)
                e.rewards = e.rewards.to(torch.promote_types(e.rewards.dtype, torch.float32))
            state = before_advantages(experiences, n)
            out = original(self, experiences)
            after_advantages(out, state, n, self.args.algo.advantage.estimator)
        return out

    setattr(compute_advantages_and_returns, _WRAPPED, True)
    maker_cls.compute_advantages_and_returns = compute_advantages_and_returns
