"""Partial rollouts across steps, the trainer's side: the carry buffer every drop-in shares.

APRIL (Zhou et al. 2025, "Active Partial Rollouts"): each step launches more groups than
it trains on (the groups carried from earlier steps first, then the step's new prompts),
ends once enough of them are complete, and carries the unfinished samples into the next
step, where they go on as continuations.  The engine ends the step
(:mod:`vllm_rl.engine.steps`: the rule rides on every request's ``partial`` flags) and
returns each unfinished sample with its tokens, logprobs and record (reason
``carried``); this module keeps them (:class:`CarryBuffer`), sends them again
(:func:`continuation`: the original prompt and the tokens so far, which the engine
recomputes on its current weights, the record's weight-version spans and the group's
members that already ended), and joins each continuation to what came before
(:func:`merge`), so the group a trainer gets covers every sample whole.
:meth:`CarryBuffer.launch` builds a step's requests and :meth:`CarryBuffer.finish` takes
the engine's outputs back: the complete groups, the rest kept.  All or nothing: a step
works on copies of the groups it takes, and the buffer changes once, when the step's
results are in (:meth:`CarryBuffer.commit`), so an error between loses no sample.

:class:`PartialConfig` is the drop-in's setting: the rule (``over``: the step ends once
``ceil(launched / over)`` of its groups are complete, APRIL's N = N'/over; or a share
of the step's token budget; or a time), the staleness cap, and the loss's treatment of
tokens from older weights (``loss``: ``"as_is"``, APRIL's, or ``"tis"``: truncated
importance sampling with each token's rollout logprob, :func:`tis_weights`).

A restart: :meth:`CarryBuffer.state_dict` / :meth:`~CarryBuffer.load_state_dict` (or
:meth:`~CarryBuffer.save` / :meth:`~CarryBuffer.load` in a checkpoint folder,
``CHECKPOINT_FILE``) keep the buffer in a checkpoint (plain JSON types); a buffer not
restored is dropped with a record per sample (:meth:`CarryBuffer.drop_all`), never
silently.  Ending a step from the trainer's side is :mod:`vllm_rl.end_step`'s.
"""
from __future__ import annotations

import copy
import hashlib
import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Sequence

from vllm_rl.end_step import end_step, end_step_async
from vllm_rl.outcome import Reason, RolloutInfo, token_spans

LOSSES = ("as_is", "tis")
CHECKPOINT_FILE = "vllm_rl_carry.json"   # the carry buffer in a trainer's checkpoint folder

# Record fields summed over a sample's parts (DAS's counts); ARRoL's are the part's that
# reached l_detect (a continuation is never scored again).
_SUMMED = ("draft_proposed", "draft_accepted", "draft_rounds", "draft_off_steps")
_ARROL = ("score", "q", "p", "head_version", "head_auc", "pruned", "hidden_id", "trace",
          "floor")


@dataclass(frozen=True)
class PartialConfig:
    """Partial rollouts as a drop-in's setting.

    * ``over``: APRIL's over-provisioning N'/N.  The step ends once ``ceil(launched /
      over)`` of its launched groups (carried ones first, then the step's prompts) are
      complete; the rest are carried.  At steady state a step trains as many groups as
      the trainer gave it and carries ``(over - 1)`` times that many.
    * ``token_share``: instead, end the step once its samples have generated this share
      of its token budget (launched samples × ``max_tokens``);
      ``time_s``: or once this many seconds have passed (either beside ``over``: the
      first rule that holds ends the step).
    * ``max_staleness``: a sample that would be carried more than this many steps past
      the one it started in is dropped (reason ``stale``, out of the loss and the
      baseline); None: no cap (APRIL).
    * ``loss``: ``"as_is"`` (APRIL: the samples as they are) or ``"tis"`` (each token's
      loss times ``min(pi_current / pi_rollout, tis_cap)``, with the rollout's own
      logprob of the token under the weights it was sampled with).
    """

    over: float = 2.0
    token_share: float | None = None
    time_s: float | None = None
    max_staleness: int | None = None
    loss: str = "as_is"
    tis_cap: float = 2.0

    def __post_init__(self) -> None:
        if not self.over >= 1.0:
            raise ValueError(f"PartialConfig.over = {self.over}: at least 1 (N' >= N)")
        if self.token_share is not None and not 0.0 < self.token_share <= 1.0:
            raise ValueError(f"PartialConfig.token_share = {self.token_share}: in (0, 1]")
        if self.loss not in LOSSES:
            raise ValueError(f"PartialConfig.loss = {self.loss!r}: one of {LOSSES}")
        if not self.tis_cap > 0:
            raise ValueError(f"PartialConfig.tis_cap = {self.tis_cap}: positive")

    @classmethod
    def of(cls, value: "PartialConfig | dict | bool | None") -> "PartialConfig | None":
        """A setting as a framework's configuration gives it (a mapping, True: the
        defaults, None / False: off)."""
        if value is None or value is False:
            return None
        if value is True:
            return cls()
        if isinstance(value, cls):
            return value
        return cls(**dict(value))

    def need(self, groups: int) -> int:
        """APRIL's N: the complete groups that end a step launching ``groups``."""
        return max(1, math.ceil(groups / self.over))

    def rule(self, step: int, groups: int, samples: int, max_tokens: int,
             by_engine: bool = True) -> dict[str, Any]:
        """The ``partial`` flags of a step that launches ``groups`` groups of ``samples``
        samples in all.  ``by_engine``: the engine ends the step itself (one engine
        sees every group: TRL, the bench); else the drop-in counts the groups across
        its engines (verl's replicas, OpenRLHF's actors) and ends the step on each
        (:func:`end_step_async`), and the flags carry the step and the cap only (the
        drop-in keeps the time rule; a token share is refused: it is a budget of the
        whole step)."""
        flags: dict[str, Any] = {"step": step}
        if by_engine:
            flags["until_groups"] = self.need(groups)
            if self.token_share is not None:
                flags["until_tokens"] = max(1, int(self.token_share * samples * max_tokens))
            if self.time_s is not None:
                flags["until_s"] = self.time_s
        elif self.token_share is not None:
            raise ValueError("PartialConfig.token_share ends a step on one engine's "
                             "tokens; with the step spread over engines use over or time_s")
        if self.max_staleness is not None:
            flags["max_staleness"] = self.max_staleness
        return flags


@dataclass
class Part:
    """One sample as far as it went: every token so far, its logprob (under the weights
    that sampled it) and the record of the whole sample (:func:`merge`)."""

    token_ids: list[int]
    logprobs: list[float]
    info: RolloutInfo
    seed: int | None = None          # its original request's seed (its coins)
    text: str | None = None
    extra: Any = None                # the drop-in's own copy of it (OpenRLHF's response)

    def to_json(self) -> dict:
        return {"token_ids": self.token_ids, "logprobs": self.logprobs,
                "info": self.info.to_json(), "seed": self.seed, "text": self.text,
                "extra": self.extra}

    @classmethod
    def from_json(cls, d: dict) -> "Part":
        return cls(list(d["token_ids"]), list(d["logprobs"]), RolloutInfo.from_json(d["info"]),
                   d.get("seed"), d.get("text"), d.get("extra"))


# What a continuation keeps of its sample's SamplingParams: the settings that shape the
# distribution its tokens are drawn from and how it ends (vLLM's own field names).
SAMPLING = ("temperature", "top_p", "top_k", "min_p", "presence_penalty",
            "frequency_penalty", "repetition_penalty", "ignore_eos", "stop", "stop_token_ids",
            "include_stop_str_in_output", "skip_special_tokens", "min_tokens", "logprobs")


def sampling_of(sp: Any) -> dict[str, Any]:
    """``sp``'s :data:`SAMPLING` settings, as plain JSON types."""
    out = {}
    for name in SAMPLING:
        value = getattr(sp, name, None)
        out[name] = list(value) if isinstance(value, (tuple, set)) else value
    return out


@dataclass
class CarriedGroup:
    """A group some of whose samples were carried: what it needs to go on."""

    prompt: Any                      # the trainer's prompt (its text, its row's key)
    prompt_ids: list[int]
    flags: dict | None               # the group's vllm_rl flags as sent (raw form)
    group_id: str
    size: int                        # M
    redundant: int                   # M'
    start_step: int
    ended: list[Part] = field(default_factory=list)      # ended (or dropped), in order
    carried: list[Part] = field(default_factory=list)
    row: Any = None                  # the trainer's input row (JSON-able), if it keeps one
    sampling: dict | None = None     # its requests' SAMPLING settings (None: temperature only)

    def add(self, part: Part) -> None:
        """``part`` among the carried samples if its step ended first, else the ended."""
        carried = part.info is not None and part.info.reason is Reason.CARRIED
        (self.carried if carried else self.ended).append(part)

    def to_json(self) -> dict:
        return {"prompt": self.prompt, "prompt_ids": self.prompt_ids, "flags": self.flags,
                "group_id": self.group_id, "size": self.size, "redundant": self.redundant,
                "start_step": self.start_step, "row": self.row, "sampling": self.sampling,
                "ended": [p.to_json() for p in self.ended],
                "carried": [p.to_json() for p in self.carried]}

    @classmethod
    def from_json(cls, d: dict) -> "CarriedGroup":
        return cls(d["prompt"], list(d["prompt_ids"]), d["flags"], d["group_id"], d["size"],
                   d["redundant"], d["start_step"], [Part.from_json(p) for p in d["ended"]],
                   [Part.from_json(p) for p in d["carried"]], d.get("row"), d.get("sampling"))


def merge(prior: Part | None, token_ids: Sequence[int], logprobs: Sequence[float],
          info: RolloutInfo, seed: int | None = None, text: str | None = None) -> Part:
    """A part returned by the engine joined to the sample's earlier parts: tokens and
    logprobs concatenated; the engine's record already counts the whole sample (length,
    weight-version spans, steps: the continuation's flags told it), DAS's counts are
    summed over the parts and ARRoL's fields kept from the part that was scored."""
    if prior is None:
        return Part(list(token_ids), list(logprobs), info, seed, text)
    extra = {k: (getattr(prior.info, k) or 0) + (getattr(info, k) or 0)
             for k in _SUMMED if getattr(prior.info, k) is not None}
    extra.update({k: getattr(prior.info, k) for k in _ARROL
                  if getattr(info, k) is None and getattr(prior.info, k) is not None})
    joined = None if text is None or prior.text is None else prior.text + text
    return Part(prior.token_ids + list(token_ids), prior.logprobs + list(logprobs),
                replace(info, **extra), prior.seed, joined)


def spans(info: RolloutInfo) -> list[list[int]]:
    """A record's weight-version spans, ``[[v, first token], ...]`` (one span if it never
    crossed a sync), each holding a token of the sample
    (:func:`~vllm_rl.outcome.token_spans`: the engine writes them so; a record kept by
    an older engine is cut here), so they go back as ``partial.prior_versions``."""
    if info.weight_versions:
        return token_spans(info.weight_versions, info.length)
    return [[info.weight_version or 0, 0]]


def continuation(group: CarriedGroup, part: Part, step: int, rule: dict[str, Any],
                 max_tokens: int) -> tuple[list[int], dict[str, Any], int, int]:
    """A carried sample sent again at ``step``: its prompt ids (the original prompt and
    the tokens so far), its ``vllm_rl`` flags (the group's, DUET's thresholds fixed to
    the ones it ran with and its gate kept open where it ran open: the same coin then
    meets the same eps, whatever ``duet.regime_gate`` now decides; the step's rule, and
    the continuation's fields), its
    ``max_tokens`` (what is left) and its seed (the original one moved on by the tokens
    so far: the tokens still to come are drawn afresh; the coins use the original)."""
    flags = copy.deepcopy(group.flags) or {}
    flags["group"] = {"id": group.group_id, "size": group.size, "redundant": group.redundant}
    info = part.info
    if flags.get("duet") is not None:
        fixed: dict[str, Any] = {} if info.k1 is None else {"k1": info.k1, "k2": info.k2}
        if info.gate_open:          # the part met (or could meet) the coin at eps: the
            fixed["regime_gate"] = False   # sample keeps it, so Eq. 6's 1/eps stays exact
        flags["duet"] = dict(flags["duet"] or {}, **fixed)
    flags.pop("arrol", None)                  # scored once, in the part that reached it
    n = len(part.token_ids)
    flags["partial"] = dict(
        rule, start_step=info.start_step if info.start_step is not None else group.start_step,
        prior_tokens=n, seed=part.seed, prior_versions=spans(info),
        group_ended=[[p.info.length, bool(p.info.valid and not p.info.eps_kept)]
                     for p in group.ended])
    seed = None if part.seed is None else int(hashlib.blake2b(
        f"{part.seed}:{n}:{step}".encode(), digest_size=4).hexdigest(), 16)
    return group.prompt_ids + part.token_ids, flags, max_tokens - n, seed


def stale_part(part: Part, step: int) -> Part:
    """``part`` dropped before it was sent again (the cap, a prompt gone from the
    dataset, a restart without the buffer): its record says ``stale``, weight 0."""
    return replace(part, info=replace(part.info, reason=Reason.STALE, weight=0.0, step=step,
                                      steps_crossed=step - (part.info.start_step or step)))


class CarryBuffer:
    """The groups carried into the next step, oldest first.

    All or nothing: a step works on copies of the groups it takes (:meth:`take`,
    :meth:`launch`), and the buffer changes only when the step's results are in
    (:meth:`commit`, which :meth:`finish` calls).  An error anywhere between (a bad
    request, a failed generate, a trainer that stops) leaves the buffer as it was, so the
    next step, or a checkpoint (:meth:`state_dict`), still holds every carried sample.
    """

    def __init__(self) -> None:
        self.groups: list[CarriedGroup] = []
        self._taken: list[CarriedGroup] = []     # the groups the step in flight took
        # the engine's weight version the last committed step ran under: an engine
        # restarted from a checkpoint counts its syncs from 0 again, and is moved past it
        # (:func:`vllm_rl.weights.sync_past`) so the records' versions stay ordered
        self.weight_version: int | None = None

    def __len__(self) -> int:
        return len(self.groups)

    def samples(self) -> int:
        return sum(len(g.carried) for g in self.groups)

    def take(self, step: int, max_staleness: int | None,
             keep: Callable[[CarriedGroup], bool] | None = None
             ) -> tuple[list[CarriedGroup], list[CarriedGroup]]:
        """Copies of the buffer's groups for ``step``: the groups to continue, and those
        that end now because none of their samples may go on (each carried sample past
        ``max_staleness``, or its prompt no longer ``keep``-ed: dropped with a ``stale``
        record into the group's ended members).  The buffer keeps the groups until
        :meth:`commit`; taking again before it takes them afresh."""
        go, done = [], []
        for original in self.groups:
            g = replace(original, ended=list(original.ended), carried=[])
            drop_all = keep is not None and not keep(g)
            for part in original.carried:
                start = part.info.start_step if part.info.start_step is not None \
                    else g.start_step
                if drop_all or (max_staleness is not None and step - start > max_staleness):
                    g.ended.append(stale_part(part, step))
                else:
                    g.carried.append(part)
            (go if g.carried else done).append(g)
        self._taken = list(self.groups)
        return go, done

    def commit(self, carried: Iterable[CarriedGroup]) -> None:
        """The step's results are in: the groups it took leave the buffer, and
        ``carried`` (its groups with a sample carried again, or carried first) join it,
        after any group the buffer took in meanwhile."""
        taken = {id(g) for g in self._taken}
        self.groups = [g for g in self.groups if id(g) not in taken] + list(carried)
        self._taken = []

    def launch(self, cfg: PartialConfig, step: int, prompts: Sequence[Any],
               params: Sequence[Any], max_tokens: int, temperature: float,
               rows: Sequence[Any] | None = None,
               keep: Callable[[CarriedGroup], bool] | None = None) -> PartialStep:
        """Step ``step``'s requests: the buffer's carried samples as continuations
        (:func:`continuation`: each with its sample's own sampling settings, ``temperature``
        alone for a group kept without them), then ``prompts`` with their ``params``
        (each a group),
        every one with the step's rule (:meth:`PartialConfig.rule` over the groups
        launched) in a copy of its ``SamplingParams`` (the caller's stay as they are; a
        prompt without ``vllm_rl`` flags gets the rule alone).  ``rows``: the trainer's
        input row of each prompt, kept with its group.  The buffer is unchanged until
        :meth:`finish`; a bad argument raises before anything is built."""
        from vllm import SamplingParams

        from vllm_rl.flags import rl_params

        if len(params) != len(prompts) or (rows is not None and len(rows) != len(prompts)):
            raise ValueError(f"CarryBuffer.launch: {len(prompts)} prompts, {len(params)} "
                             f"SamplingParams" + ("" if rows is None else f", {len(rows)} rows")
                             + ": one each; the carry buffer is unchanged")
        own = []
        for i, sp in enumerate(params):
            flags = (sp.extra_args or {}).get("vllm_rl")
            if flags is not None and not isinstance(flags, dict):
                raise ValueError(
                    f"CarryBuffer.launch: prompt {i}'s extra_args['vllm_rl'] is a "
                    f"{type(flags).__name__}; partial rollouts need the nested form "
                    "(vllm_rl.rl_params(...)); the carry buffer is unchanged")
            own.append(dict(flags or {}))
        going, done = self.take(step, cfg.max_staleness, keep)
        samples = sum(len(g.carried) for g in going) + sum(sp.n for sp in params)
        rule = cfg.rule(step, len(going) + len(prompts), samples, max_tokens)
        out = PartialStep(step, done=done, continued=going)
        for g in going:
            for part in g.carried:
                ids, flags, left, seed = continuation(g, part, step, rule, max_tokens)
                kept = dict(g.sampling or {"temperature": temperature})
                kept["logprobs"] = kept.get("logprobs") or 0
                kept["min_tokens"] = max(0, (kept.get("min_tokens") or 0) - len(part.token_ids))
                out.prompts.append({"prompt_token_ids": ids})
                out.params.append(SamplingParams(n=1, max_tokens=left, seed=seed,
                                                 extra_args=rl_params(**flags), **kept))
                out.handles.append((g, part))
            g.carried = []
        for i, (p, sp, flags) in enumerate(zip(prompts, params, own)):
            sp = sp.clone()
            sp.extra_args = dict(sp.extra_args or {}, vllm_rl=dict(flags, partial=dict(rule)))
            out.prompts.append(p)
            out.params.append(sp)
            out.handles.append(None if rows is None else rows[i])
        return out

    def finish(self, launched: PartialStep, outputs: Sequence[Any]) -> list[CarriedGroup]:
        """The engine's outputs of :meth:`launch`'s requests, in order: each sample's
        parts joined, its group kept for the next step while any of its samples was
        carried (:meth:`commit`); returns the groups complete now (every sample ended:
        this step's and earlier ones), oldest first.  Outputs that do not match the
        requests raise, the buffer unchanged."""
        if len(outputs) != len(launched.handles):
            raise ValueError(f"CarryBuffer.finish: {len(outputs)} outputs for "
                             f"{len(launched.handles)} requests of step {launched.step}; "
                             "the carry buffer is unchanged")
        new: list[CarriedGroup] = []
        for handle, sp, out, p in zip(launched.handles, launched.params, outputs,
                                      launched.prompts):
            comps = list(out.outputs)
            launched.tokens += sum(len(c.token_ids) for c in comps)
            if isinstance(handle, tuple):
                g, prior = handle
                if len(comps) != 1:
                    raise ValueError(f"CarryBuffer.finish: a continuation of group "
                                     f"{g.group_id} came back with {len(comps)} samples; "
                                     "the carry buffer is unchanged")
                g.add(part_of(comps[0], prior=prior))
                continue
            raw = {k: v for k, v in sp.extra_args["vllm_rl"].items() if k != "partial"}
            parts = [part_of(c, sp) for c in comps]
            gid = next((p.info.group_id for p in parts if p.info.group_id), None)
            size = (raw.get("group") or {}).get("size") or sp.n
            g = CarriedGroup(p, list(out.prompt_token_ids), raw, gid, size, sp.n,
                             launched.step, row=handle, sampling=sampling_of(sp))
            for part in parts:
                g.add(part)
            new.append(g)
        complete, carried = [], []
        for g in launched.done + launched.continued + new:
            (carried if g.carried else complete).append(g)
        self.commit(carried)
        return complete

    def drop_all(self, step: int) -> list[CarriedGroup]:
        """Every carried sample dropped with a record (a restart that does not restore
        the buffer); the groups, now complete, returned for the caller to log."""
        done = self.take(step, None, keep=lambda g: False)[1]
        self.commit(())
        return done

    def state_dict(self) -> dict:
        """The buffer as plain JSON types: every group it holds, a step in flight's
        taken groups included (that step has not trained them)."""
        return {"groups": [g.to_json() for g in self.groups],
                "weight_version": self.weight_version}

    def load_state_dict(self, state: dict) -> None:
        self.groups = [CarriedGroup.from_json(g) for g in state.get("groups", [])]
        self.weight_version = state.get("weight_version")
        self._taken = []

    def save(self, folder: str) -> str:
        """:meth:`state_dict` into a trainer's checkpoint ``folder`` (``CHECKPOINT_FILE``),
        written whole and then moved into place; its path."""
        import json
        import os

        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, CHECKPOINT_FILE)
        with open(path + ".tmp", "w") as f:
            json.dump(self.state_dict(), f)
        os.replace(path + ".tmp", path)
        return path

    def load(self, folder: str) -> bool:
        """The buffer a checkpoint ``folder`` kept (:meth:`save`), in place of this one;
        False, the buffer unchanged, where the folder holds none (nothing was carried
        when it was written, or it comes from a run without partial rollouts)."""
        import json
        import os

        path = os.path.join(folder, CHECKPOINT_FILE)
        if not os.path.exists(path):
            return False
        with open(path) as f:
            self.load_state_dict(json.load(f))
        return True


@dataclass
class PartialStep:
    """One step's requests with partial rollouts (:meth:`CarryBuffer.launch`): the
    carried samples as continuations, then the step's own requests; :meth:`finish`
    takes the engine's outputs (in the same order) back."""

    step: int
    prompts: list = field(default_factory=list)        # the engine's prompts
    params: list = field(default_factory=list)         # their SamplingParams
    handles: list = field(default_factory=list)        # (group, part), or a new one's row
    done: list[CarriedGroup] = field(default_factory=list)  # ended at take (all dropped)
    continued: list[CarriedGroup] = field(default_factory=list)
    tokens: int = 0                                    # generated by this step's requests


def part_of(c, sp=None, prior: Part | None = None) -> Part:
    """A vLLM ``CompletionOutput`` as a :class:`Part`: its tokens, their logprobs (0
    where the engine gave none), its record, its seed (``sp``'s, moved on by the child's
    index as vLLM seeds an ``n > 1`` request's children); joined to ``prior``."""
    ids = list(c.token_ids)
    lps = ([lp[t].logprob for lp, t in zip(c.logprobs, ids)] if c.logprobs
           else [0.0] * len(ids))
    info = getattr(c, "rollout_info", None) or RolloutInfo.from_completion(c)
    seed = None if sp is None or sp.seed is None else sp.seed + c.index
    return merge(prior, ids, lps, info, seed, c.text)


#: The age bins of :func:`staleness`'s distribution: 0, 1, 2 and 3 or more steps.
AGE_BINS = ("0", "1", "2", "3plus")


def staleness(parts: Iterable[Part], version: int | None = None) -> dict[str, float]:
    """The staleness of a step's trained samples, exactly.

    A trained token's *age* is the weight version the step trains from (``version``: the
    engine's weight version after the step's sync; default the newest among the samples'
    spans, which is that version whenever the step generated a token) minus the version
    it was sampled under (:func:`spans`).  A sample that ended in an earlier step and
    trains now, beside a carried sibling, holds tokens a step old although it never
    crossed a sync.  Returned:

    * ``stale_sample_share``: the share of samples holding any token of age > 0;
    * ``stale_token_share``: the share of tokens of age > 0; ``token_age_mean`` and
      ``token_age_max``; ``token_age_share_{0,1,2,3plus}``: the distribution of ages over
      tokens;
    * ``staleness_mean`` / ``staleness_max``: the syncs each sample crossed while it
      generated (``steps_crossed``), and ``carried_share``: the share carried at least
      once.
    """
    parts = list(parts)
    crossed = [p.info.steps_crossed or 0 for p in parts]
    cut = [spans(p.info) for p in parts]
    if version is None:
        version = max((v for s in cut for v, _ in s), default=0)
    ages: dict[int, int] = {}
    stale_samples = 0
    for part, s in zip(parts, cut):
        n = len(part.token_ids)
        ends = [i for _, i in s[1:]] + [n]
        old = False
        for (v, start), end in zip(s, ends):
            count = min(end, n) - min(start, n)
            if count <= 0:
                continue
            age = version - v
            if age < 0:
                raise ValueError(f"a token sampled under weight version {v}, newer than "
                                 f"the step's {version}")
            ages[age] = ages.get(age, 0) + count
            old = old or age > 0
        stale_samples += old
    total = max(sum(ages.values()), 1)
    n = max(len(parts), 1)
    out = {"staleness_mean": sum(crossed) / n, "staleness_max": float(max(crossed, default=0)),
           "carried_share": sum(1 for c in crossed if c > 0) / n,
           "stale_sample_share": stale_samples / n,
           "stale_token_share": sum(k for a, k in ages.items() if a > 0) / total,
           "token_age_mean": sum(a * k for a, k in ages.items()) / total,
           "token_age_max": float(max(ages, default=0))}
    for label in AGE_BINS:
        lo = int(label.removesuffix("plus"))
        inside = (lambda a: a >= lo) if label.endswith("plus") else (lambda a: a == lo)
        out[f"token_age_share_{label}"] = sum(k for a, k in ages.items() if inside(a)) / total
    return out


def tis_weights(current: Sequence[float], rollout: Sequence[float], cap: float) -> list[float]:
    """Truncated importance sampling, per token: ``min(exp(current - rollout), cap)``
    (the current policy's logprob over the one the token was sampled with)."""
    return [min(math.exp(c - r), cap) for c, r in zip(current, rollout)]


__all__ = ["AGE_BINS", "CHECKPOINT_FILE", "CarriedGroup", "CarryBuffer", "LOSSES", "Part",
           "PartialConfig", "PartialStep", "SAMPLING", "continuation", "end_step",
           "end_step_async", "merge", "part_of", "sampling_of", "spans", "stale_part",
           "staleness", "tis_weights"]
