"""RLScheduler: vLLM's scheduler plus the one place where RL techniques end requests.

Use it with ``scheduler_cls="vllm_rl.engine.scheduler.RLScheduler"`` (``vllm_rl.LLM`` and
``vllm_rl.engine_args`` set it for you).  :class:`RLScheduler` extends vLLM's
``AsyncScheduler``; :class:`RLSyncScheduler` the same logic on vLLM's synchronous
``Scheduler``, for engines whose speculative method runs on the CPU (DAS), which vLLM
schedules synchronously.  A request without RL flags takes exactly
vLLM's path; a request with flags gets a :class:`~vllm_rl.engine.groups.Member` at
admission, and per step:

* a sample the worker scored at ``l_detect`` this step (ARRoL: the verdict comes with
  the step's output, ``ModelRunnerOutput.vllm_rl_arrol``) ends if its coin pruned it;
* its new tokens pass through the enabled per-sample policy (DUET), which may end it
  (answer complete: trimmed; no marker past ``K2 + G``: aborted unless its coin keeps it);
* after the step, a group whose M shortest valid samples are known (DARTS early stop,
  exact: every sibling still generating has at least as many tokens as the M-th
  shortest finished one) is stopped, and the scheduler finishes every other live member
  at the end of the same step, freeing their KV blocks and returning their partial
  output with a reason.

When several techniques act on one group, the composition rule of
``docs/ARCHITECTURE.md`` decides who may remove what: inside a DARTS group DUET's gate is
DARTS's length cap (no eps-keep) and ARRoL never prunes the group below its M (a coin that
would is overruled and the record says so); pruned, aborted and cancelled samples never
count toward M.

Every early end keeps the tokens (and logprobs) the model really produced and writes a
:class:`~vllm_rl.outcome.RolloutInfo` record into the request's ``stop_reason``.  With
speculative decoding a step may bring several tokens; the policies read the count, so
a poll or a gate crossed inside a step is seen at that step, and the record counts the
draft tokens each sample was verified on and how many were accepted.
"""
from __future__ import annotations

from vllm.logger import init_logger
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs
from vllm.v1.request import Request, RequestStatus

from vllm_rl.arrol.config import check_runner
from vllm_rl.engine.groups import GroupRegistry, GroupState, Member
from vllm_rl.darts import rule as darts
from vllm_rl.duet import markers
from vllm_rl.duet import rule as duet
from vllm_rl.arrol.rule import ArrolVerdict
from vllm_rl.engine.trace import TraceMixin
from vllm_rl.flags import KEY, read_or_warn
from vllm_rl.outcome import Reason, RolloutInfo

logger = init_logger(__name__)

# How an early end shows in vLLM's own finish_reason ("abort"): the sample did not end
# by itself.  The exact reason is in the RolloutInfo record.
EARLY_END_STATUS = RequestStatus.FINISHED_ABORTED


class RLSchedulerMixin(TraceMixin):
    """The RL logic, over either of vLLM's schedulers (every override calls vLLM's own)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        check_runner(self.vllm_config)      # ARRoL: the capture patch serves the V1 runner
        self.rl_groups = GroupRegistry()
        self.rl_members: dict[str, Member] = {}
        self._stopped_groups: list[GroupState] = []
        self._watched: dict[str, GroupState] = {}   # M valid ended, shortest not yet known
        self.rl_step = 0
        # Early-stop groups whose M shortest became known (stopped, or every member had
        # ended by then), and the steps they ran past their M-th valid end: the price
        # of exact shortest-M over stopping at the M-th finish.
        self.rl_stats = {"groups_stopped": 0, "groups_resolved": 0, "stop_wait_steps": 0,
                         "arrol_scored": 0, "arrol_pruned": 0, "arrol_floor": 0}
        self._arrol_pending: list[Member] = []
        self.duet_thresholds: dict[str, duet.OnlineThresholds] = {}
        self._duet_live: dict[str, int] = {}
        self._tokenizer = None
        # Weight syncs seen (every prefix-cache reset is one: ``reset_prefix_cache``)
        # and the last one's report.
        self.rl_weight_version = 0
        self.rl_last_sync: dict | None = None

    # ------------------------------------------------------------------ admission
    def add_request(self, request: Request) -> None:
        params = request.sampling_params
        if params is not None and params.extra_args and request.request_id not in self.requests:
            member = self._admit(request, params.extra_args)
            if member is not None:
                self.rl_members[request.request_id] = member
                if member.flags.group is not None:
                    self.rl_groups.join(member)
        super().add_request(request)

    def _admit(self, request: Request, extra_args: dict) -> Member | None:
        """The engine's one read of a request's flags (the canonical form the front end
        wrote; :func:`vllm_rl.flags.read`).  Flags the front end did not vet (it was
        bypassed) that do not read are logged once and the request is served without
        them: they leave its params, so the workers' readers never see them either."""
        if not any(k == KEY or k.startswith(KEY + ".") for k in extra_args
                   if isinstance(k, str)):
            return None
        flags = read_or_warn(extra_args, request.request_id, logger,
                             default_group_id=request.request_id)
        if flags is None:
            params = request.sampling_params
            params.extra_args = {k: v for k, v in extra_args.items()
                                 if not (isinstance(k, str) and k.startswith(KEY))} or None
            return None
        member = Member(request.request_id, flags, weight_version=self.rl_weight_version)
        if flags.duet is not None:
            member.duet = self._duet_state(request, flags.duet, flags.darts is not None)
        return member

    def _duet_state(self, request: Request, f, in_darts: bool) -> duet.DuetState:
        kind = _duet_kind(f)
        online = self.duet_thresholds.setdefault(kind, duet.OnlineThresholds())
        cold_k1, cold_k2 = online.thresholds(request.max_tokens)
        prompt = ""
        if f.marker == "code" and f.pattern is None:
            prompt = self.tokenizer.decode(request.prompt_token_ids or [])
        self._duet_live[kind] = self._duet_live.get(kind, 0) + 1
        return duet.DuetState(
            flags=f, detector=markers.detector(f.marker, f.pattern, prompt),
            k1=cold_k1 if f.k1 is None else f.k1, k2=cold_k2 if f.k2 is None else f.k2,
            coin=duet.seeded_coin(request.sampling_params.seed, request.prompt_token_ids,
                                  request.request_id),
            eps=0.0 if in_darts else f.eps)       # composition: the gate caps DARTS's pool


    @property
    def tokenizer(self):
        if self._tokenizer is None:
            from vllm.tokenizers import cached_tokenizer_from_config

            self._tokenizer = cached_tokenizer_from_config(self.vllm_config.model_config)
        return self._tokenizer

    # ------------------------------------------------------------------ per step
    def _update_request_with_output(
        self, request: Request, new_token_ids: list[int], is_stale: bool = False
    ) -> tuple[list[int], bool]:
        new_token_ids, stopped = super()._update_request_with_output(
            request, new_token_ids, is_stale)
        member = self.rl_members.get(request.request_id)
        if member is None:
            return new_token_ids, stopped
        if member.step_accepted:       # accepted drafts among the tokens the sample kept
            member.draft_accepted += min(member.step_accepted, len(new_token_ids))
            member.step_accepted = 0
        group = member.group
        if group is not None and group.stopped:
            # Its group already has its M shortest (possibly earlier in this very step).
            request.status = EARLY_END_STATUS
            _write_cancel_record(request, member)
            if member.duet is not None:
                self._duet_observe(member, Reason.DARTS_CANCELLED, request.num_output_tokens)
            return new_token_ids, True
        if stopped:
            self._record_end(request, member, _natural_reason(request))
        elif member.arrol_pending:         # pruned by its ARRoL verdict this step
            member.arrol_pending = False
            request.status = EARLY_END_STATUS
            self._record_end(request, member, Reason.ARROL_PRUNED)
            return new_token_ids, True
        elif member.duet is not None:
            action = duet.step(member.duet, request.num_output_tokens,
                               lambda: self.tokenizer.decode(
                                   request.output_token_ids[-duet.WINDOW_TOKENS:]))
            if action is not None:
                request.status = EARLY_END_STATUS
                self._record_end(request, member, _DUET_REASON[action])
                return new_token_ids, True
        return new_token_ids, stopped

    def update_from_output(self, scheduler_output, model_runner_output):
        if scheduler_output.scheduled_spec_decode_tokens and self.rl_members:
            self._count_drafts(scheduler_output, model_runner_output)
        self.rl_step += 1
        verdicts = getattr(model_runner_output, "vllm_rl_arrol", None)
        if verdicts:
            self._take_verdicts(verdicts)
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        if self._arrol_pending:
            self._prune_pending(outputs)
        if self._watched:
            self._check_watched()
        if self._stopped_groups:
            self._cancel_stopped_groups(outputs)
        return outputs

    def _take_verdicts(self, verdicts: dict) -> None:
        """ARRoL verdicts of this step: each sample's first one is kept (a request is
        scored once); a pruned sample ends at its update in this same step, unless its
        DARTS group would then keep fewer than M samples that can still be selected
        (composition rule: the coin is overruled, ``floor`` in the record)."""
        for rid, verdict in verdicts.items():
            member = self.rl_members.get(rid)
            if member is None or member.flags.arrol is None or member.arrol is not None:
                continue
            verdict = ArrolVerdict(*verdict)
            if verdict.pruned and _at_floor(member):
                verdict = verdict._replace(pruned=False)
                member.arrol_floor = True
                self.rl_stats["arrol_floor"] += 1
            member.arrol = verdict
            if verdict.pruned:
                member.arrol_pending = True
                self._arrol_pending.append(member)
            self.rl_stats["arrol_scored"] += 1

    def _prune_pending(self, outputs: dict[int, EngineCoreOutputs]) -> None:
        """Pruned samples that had no new token this step (a recomputed prefill chunk)
        end now, like an early-stopped group's members."""
        pending, self._arrol_pending = self._arrol_pending, []
        ends = []
        for member in pending:
            request = self.requests.get(member.request_id)
            if not member.arrol_pending or request is None or request.is_finished():
                continue
            member.arrol_pending = False
            self._record_end(request, member, Reason.ARROL_PRUNED)
            ends.append(member.request_id)
        if ends:
            self._finish_now(ends, outputs)

    def _check_watched(self) -> None:
        """Stop each watched group whose M shortest valid samples are now known."""
        for gid, group in list(self._watched.items()):
            live = []
            for m in group.live.values():
                if m.finish_rank is None:
                    req = self.requests.get(m.request_id)
                    live.append(req.num_output_tokens if req is not None else 0)
            missing = max(0, group.flags.redundant - group.arrived)
            if darts.selection_final(group.finished, group.flags.size, live, missing):
                del self._watched[gid]
                group.stopped = True
                self.rl_stats["groups_resolved"] += 1
                self.rl_stats["stop_wait_steps"] += self.rl_step - group.full_at_step
                if live:
                    self.rl_stats["groups_stopped"] += 1
                    self._stopped_groups.append(group)

    def _count_drafts(self, scheduler_output, model_runner_output) -> None:
        """Per sample: draft tokens verified this step, and how many were accepted (of
        which those the sample keeps, i.e. not past a stop, count at its update)."""
        sampled = model_runner_output.sampled_token_ids
        index = model_runner_output.req_id_to_index
        for req_id, spec in scheduler_output.scheduled_spec_decode_tokens.items():
            member = self.rl_members.get(req_id)
            i = index.get(req_id)
            if member is None or i is None or not sampled or not sampled[i]:
                continue
            member.draft_proposed += sum(1 for t in spec if t >= 0)
            member.step_accepted = len(sampled[i]) - 1   # kept ones counted at the update

    def _free_request(self, request: Request, delay_free_blocks: bool = False):
        member = self.rl_members.pop(request.request_id, None)
        if member is not None:
            self.rl_groups.leave(member)
            if member.duet is not None:
                self._duet_left(member.duet)
        return super()._free_request(request, delay_free_blocks)

    def _duet_left(self, state: duet.DuetState) -> None:
        """A round of DUET sampling ends when the engine has none left (App. A.3 refit)."""
        kind = _duet_kind(state.flags)
        self._duet_live[kind] -= 1
        if self._duet_live[kind] == 0:
            self.duet_thresholds[kind].end_round()

    # ------------------------------------------------------------------ weight syncs
    def reset_prefix_cache(self, reset_running_requests: bool = False,
                           reset_connector: bool = False) -> bool:
        """A weight sync: after it, no request reads KV computed with older weights.

        verl, OpenRLHF, TRL and :mod:`vllm_rl.weights` reset the prefix cache at every
        weight sync.  vLLM's reset refuses (and logs it) while requests hold blocks,
        which leaves every cached block of the old weights open to new hits.  Here the
        requests holding blocks are always preempted first, as vLLM's own
        ``pause_generation(clear_cache=True)`` does (``reset_running_requests``): their
        blocks are freed, the cache is emptied, and they resume by recomputing their
        prompt and tokens so far on the new weights.  So the reset succeeds (vLLM itself
        raises where a KV-connector transfer is still pending), and a block cached
        afterwards was computed afterwards.  Any reset counts as a sync, a user's own
        included: the cost is a recompute and a version step, never old KV.

        The sync bumps :attr:`rl_weight_version`; a flagged sample with tokens from
        before it says in its record where the new version began
        (``RolloutInfo.weight_versions``).  :attr:`rl_last_sync` reports what happened
        (read by the ``vllm_rl_weight_sync`` utility, ``patches/weight_sync.py``).
        """
        recomputed = sum(1 for r in self.running if r.num_computed_tokens > 0)
        cached = _cached_blocks(self.kv_cache_manager)
        ok = super().reset_prefix_cache(True, reset_connector)
        self.rl_weight_version += 1
        version, across = self.rl_weight_version, 0
        for rid, member in self.rl_members.items():
            request = self.requests.get(rid)
            n = request.num_output_tokens if request is not None else 0
            if n == 0:
                member.weight_version = version     # no token from the old weights
            else:
                member.version_starts.append((version, n))
                across += 1
        self.rl_last_sync = {"weight_version": version, "prefix_cache_reset": ok,
                             "cached_blocks_dropped": cached,
                             "requests_recomputed": recomputed,
                             "flagged_samples_across": across}
        logger.info("weight sync %d: prefix cache reset (%s cached blocks dropped), %d "
                    "requests in flight recomputed on the new weights", version, cached,
                    recomputed)
        return ok

    # ------------------------------------------------------------------ helpers
    def _record_end(self, request: Request, member: Member, reason: Reason) -> None:
        """A sample ended by itself or by its own policy: count it, maybe stop its group,
        and write its record."""
        group, state = member.group, member.duet
        if group is not None:
            self.rl_groups.record_end(member, reason.valid, request.num_output_tokens)
            rl = member.flags
            if (not group.stopped and group.full_at_step is None
                    and darts.watches(rl.darts, rl.group, group.valid)):
                group.full_at_step = self.rl_step
                self._watched[group.flags.id] = group
        weight = 1.0
        if state is not None:
            weight = 0.0 if reason is Reason.DUET_ABORTED else state.weight
            self._duet_observe(member, reason, request.num_output_tokens)
        if reason is Reason.ARROL_PRUNED:
            weight = 0.0
            self.rl_stats["arrol_pruned"] += 1
        request.stop_reason = RolloutInfo(
            reason=reason, length=request.num_output_tokens, weight=weight,
            group_id=group.flags.id if group else None, finish_rank=member.finish_rank,
            stop=request.stop_reason if reason in (Reason.EOS, Reason.STOP) else None,
            **_draft_fields(member), **_arrol_fields(member, reason),
            **_version_fields(member),
            **(_duet_fields(state) if state is not None else {})).encode()

    def _duet_observe(self, member: Member, reason: Reason, length: int) -> None:
        """One DUET sample's end into its kind's natural-length window
        (:class:`~vllm_rl.duet.rule.OnlineThresholds`): an event if the model
        (or its marker) ended it, right-censored if something cut it short; a coin's
        survivor weighted by its inverse propensity, a coin's casualty left out."""
        state = member.duet
        if reason is Reason.ARROL_PRUNED or (reason is Reason.DUET_ABORTED and state.eps > 0):
            return
        weight = 1.0 / state.keep_prob if state.keep_prob > 0 else 1.0  # eps = 0: censored
        verdict = member.arrol
        if verdict is not None and verdict.p and not member.arrol_floor:
            weight /= verdict.p
        self.duet_thresholds[_duet_kind(state.flags)].observe(length, reason.valid, weight)

    def _cancel_stopped_groups(self, outputs: dict[int, EngineCoreOutputs]) -> None:
        """Finish the live members of early-stopped groups now and free their blocks."""
        groups, self._stopped_groups = self._stopped_groups, []
        for group in groups:
            members = list(group.live.values())
            for member in members:
                request = self.requests.get(member.request_id)
                if request is not None:
                    _write_cancel_record(request, member)
                    if member.duet is not None:
                        self._duet_observe(member, Reason.DARTS_CANCELLED,
                                           request.num_output_tokens)
            self._finish_now([m.request_id for m in members], outputs)

    def _finish_now(self, request_ids: list[str], outputs: dict[int, EngineCoreOutputs]) -> None:
        """End these requests now (records already written): free their blocks through
        vLLM's ``finish_requests`` and emit their final output."""
        for request in self.finish_requests(request_ids, EARLY_END_STATUS):
            eco = outputs.get(request.client_index)
            if eco is None:
                eco = outputs[request.client_index] = EngineCoreOutputs()
            eco.outputs.append(EngineCoreOutput(
                request_id=request.request_id,
                new_token_ids=[],
                finish_reason=request.get_finished_reason(),
                stop_reason=request.stop_reason,
                events=request.take_events(),
                trace_headers=request.trace_headers,
            ))


def _write_cancel_record(request: Request, member: Member) -> None:
    request.stop_reason = RolloutInfo(
        reason=Reason.DARTS_CANCELLED, length=request.num_output_tokens, weight=0.0,
        group_id=member.group.flags.id if member.group else None, **_draft_fields(member),
        **_arrol_fields(member, Reason.DARTS_CANCELLED), **_version_fields(member),
        **(_duet_fields(member.duet) if member.duet is not None else {})).encode()


def _arrol_fields(member: Member, reason: Reason) -> dict:
    v = member.arrol
    if v is None:
        return {}
    return {"score": v.score, "q": v.q, "p": v.p, "head_version": v.version,
            "pruned": reason is Reason.ARROL_PRUNED, "hidden": v.hidden,
            "trace": list(v.trace) if v.trace is not None else None,
            "floor": True if member.arrol_floor else None}


def _at_floor(member: Member) -> bool:
    """Pruning ``member`` would leave its DARTS group fewer than M samples that can still
    be selected: valid ones that ended, live ones not being pruned, ones not yet arrived."""
    group = member.group
    if group is None or member.flags.darts is None:
        return False
    others = sum(1 for m in group.live.values() if m is not member and not m.arrol_pending)
    missing = max(0, group.flags.redundant - group.arrived)
    return group.valid + others + missing < group.flags.size


def _version_fields(member: Member) -> dict:
    """The weight version of the sample's first token; where it ran across weight syncs,
    each version and the output-token index where it began."""
    if not member.version_starts:
        return {"weight_version": member.weight_version}
    spans = [[member.weight_version, 0]] + [[v, i] for v, i in member.version_starts]
    return {"weight_version": member.weight_version, "weight_versions": spans}


def _cached_blocks(kv_cache_manager) -> int | None:
    """Blocks in the prefix cache's hash map (None where vLLM's layout differs)."""
    pool = getattr(kv_cache_manager, "block_pool", None)
    table = getattr(pool, "cached_block_hash_to_block", None)
    try:
        return len(table)
    except TypeError:
        return None


def _draft_fields(member: Member) -> dict:
    if member.flags.das is None:
        return {}
    return {"draft_proposed": member.draft_proposed, "draft_accepted": member.draft_accepted}


def _duet_fields(state: duet.DuetState) -> dict:
    return {"marker_pos": state.marker_pos, "keep_prob": state.keep_prob,
            "k1": state.k1, "k2": state.k2}


def _duet_kind(f) -> str:
    return "pattern" if f.pattern is not None else f.marker


_DUET_REASON = {duet.Action.TRIM: Reason.DUET_TRIMMED, duet.Action.ABORT: Reason.DUET_ABORTED}


def _natural_reason(request: Request) -> Reason:
    if request.status == RequestStatus.FINISHED_LENGTH_CAPPED:
        return Reason.LENGTH
    return Reason.EOS if request.stop_reason is None else Reason.STOP


class RLScheduler(RLSchedulerMixin, AsyncScheduler):
    """The RL scheduler on vLLM's ``AsyncScheduler`` (the default RL engine)."""


class RLSyncScheduler(RLSchedulerMixin, Scheduler):
    """The RL scheduler on vLLM's synchronous ``Scheduler`` (DAS engines)."""
