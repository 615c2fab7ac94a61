"""RLScheduler: vLLM's scheduler plus the one place where RL techniques end requests.

Use it with ``scheduler_cls="vllm_rl.engine.scheduler.RLScheduler"`` (``vllm_rl.LLM`` and
``vllm_rl.engine_args`` set it for you).  :class:`RLScheduler` extends vLLM's
``AsyncScheduler``; :class:`RLSyncScheduler` the same logic on vLLM's synchronous
``Scheduler``, for engines whose speculative method runs on the CPU (DAS), which vLLM
schedules synchronously.  A request without RL flags takes exactly vLLM's path: every
override calls vLLM's own (``add_request``, ``update_from_output``, ``_free_request``,
``reset_prefix_cache``, and on :class:`RLScheduler` ``_update_after_schedule``);
``_free_request``, which vLLM calls inside its per-request loop, only writes the record
of a flagged sample; ``_update_after_schedule`` changes placeholder drafts only on a DAS
engine; and with no flagged request live ``update_from_output`` is vLLM's own.  A request with flags gets a
:class:`~vllm_rl.engine.groups.Member` at admission, and per step, after vLLM's update
(its tokens appended, its own stop checks done), over the flagged samples the step ran:

* a sample that ended by itself gets its record as vLLM frees it (``_free_request``,
  before vLLM builds the final output that carries it);
* a sample the worker scored at ``l_detect`` this step (ARRoL: the verdict comes with
  the step's output, ``StepOutput.verdicts``) ends if its coin pruned it;
* DUET's rule may end it (answer complete: trimmed; no marker past ``K2 + G``: aborted
  unless its coin keeps it): one comparison per sample unless a poll or the gate is due;
* a group whose M shortest valid samples are known (DARTS early stop, exact: every
  sibling still generating has at least as many tokens as the M-th shortest finished
  one) is stopped, and its live members are finished;
* partial rollouts: a trainer step whose rule holds (:mod:`vllm_rl.engine.steps`) has
  its samples still generating carried (or dropped past the staleness cap); a
  continuation's techniques count its earlier tokens too (``Member.prior``).

Every sample ended early is finished in the same step through vLLM's
``finish_requests`` (KV blocks freed now) and gets a final output of its own.

When several techniques act on one group, the composition rule of
``docs/ARCHITECTURE.md`` decides who may remove what: inside a DARTS group a sample DUET's
coin keeps past the gate leaves DARTS's pool (never counted toward M, never cancelled by
an early stop) and ARRoL never prunes the group below its M (a coin that would is
overruled and the record says so); pruned, aborted and cancelled samples never count
toward M.

Every early end keeps the tokens (and logprobs) the model really produced and writes a
:class:`~vllm_rl.outcome.RolloutInfo` record into the request's ``stop_reason``, its
carrier to the front end, which takes it out into the output's ``rollout_info`` (one
writer, :mod:`vllm_rl.engine.records`).  Each technique's engine state lives in its
folder (:mod:`vllm_rl.duet.engine`, :mod:`vllm_rl.arrol.engine`, :mod:`vllm_rl.das.engine`);
this scheduler keeps admission, composition and ending.  With speculative decoding a
step may bring several tokens; the rules read the count, so a poll or a gate crossed
inside a step is seen at that step, and the record counts the draft tokens each sample
was verified on and how many were accepted.
"""
from __future__ import annotations

from vllm.logger import init_logger
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.engine import EngineCoreOutputs
from vllm.v1.request import Request, RequestStatus

from vllm_rl.arrol import engine as arrol
from vllm_rl.arrol.config import check_runner
from vllm_rl.class_paths import ENGINE_ENV, patches_asked
from vllm_rl.darts import rule as darts
from vllm_rl.das import engine as das
from vllm_rl.das.config import DASConfig
from vllm_rl.duet.engine import DuetEngine
from vllm_rl.engine import records
from vllm_rl.engine.groups import GroupRegistry, GroupState, Member
from vllm_rl.engine.steps import StepBook, stale
from vllm_rl.engine.finish import FinishMixin
from vllm_rl.engine.trace import TraceMixin
from vllm_rl.engine.weight_sync import WeightSyncMixin
from vllm_rl.flags import KEY, FlagReads, read_step
from vllm_rl import step_output
from vllm_rl.outcome import Reason

logger = init_logger(__name__)

def check_patched() -> None:
    """Refuse to start the RL scheduler in a process that was not asked for vllm_rl's
    patches (``vllm_rl.plugin``): its flags would not be admitted, nor its records
    carried, and the engine would look like the RL engine while running vLLM's code."""
    if not patches_asked():
        raise RuntimeError(
            f"vllm_rl's scheduler runs only in an RL engine: set {ENGINE_ENV}=1 in the "
            "environment of the process that starts this engine (vllm_rl.LLM, "
            "vllm_rl.engine_args and vllm-rl serve set it; by hand: "
            f"{ENGINE_ENV}=1 vllm serve ... $(vllm_rl.server_args(...)))")


class RLSchedulerMixin(WeightSyncMixin, FinishMixin, TraceMixin):
    """The RL logic, over either of vLLM's schedulers (every override calls vLLM's own)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        check_patched()                     # vllm_rl's patches run in this engine
        check_runner(self.vllm_config)      # ARRoL: the capture patch serves the V1 runner
        self.rl_groups = GroupRegistry()
        self.rl_members: dict[str, Member] = {}
        self._flag_reads = FlagReads()      # a group's samples share one read of its flags
        # The members a rule may end after a step (DUET, ARRoL, DARTS, or a late member
        # of a stopped group): the per-step walk (_apply_rules).  A sample with DAS
        # flags alone is not walked: it has no rule.
        self._ruled: dict[str, Member] = {}
        # The engine drafts with DAS's drafter: only then are vLLM's placeholder drafts
        # the scheduler's to cut (any other drafter keeps vLLM's own scheduling).
        self.rl_das = das.DasEngine(DASConfig.from_vllm_config(self.vllm_config) is not None)
        self._stopped_groups: list[GroupState] = []
        self._watched: dict[str, GroupState] = {}   # M valid ended, shortest not yet known
        self.rl_steps = StepBook()          # partial rollouts: each trainer step's rule
        self.rl_step = 0
        # Early-stop groups whose M shortest became known (stopped, or every member had
        # ended by then), and the steps they ran past their M-th valid end: the price
        # of exact shortest-M over stopping at the M-th finish.
        self.rl_stats = {"groups_stopped": 0, "groups_resolved": 0, "stop_wait_steps": 0,
                         "arrol_scored": 0, "arrol_pruned": 0, "arrol_floor": 0}
        self._arrol_pending: list[Member] = []
        self.duet = DuetEngine(self._load_tokenizer,
                               self.vllm_config.model_config.get_vocab_size())

    # ------------------------------------------------------------------ admission
    def add_request(self, request: Request) -> None:
        params = request.sampling_params
        if params is not None and params.extra_args and request.request_id not in self.requests:
            member = self._admit(request, params.extra_args)
            if member is not None:
                self.rl_members[request.request_id] = member
                if member.flags.das is not None:
                    member.das = self.rl_das.admit()
                if member.flags.group is not None:
                    self.rl_groups.join(member)
                    self._watch(member)     # a continued group may know M valid already
                if member.flags.partial is not None and member.flags.partial.step is not None:
                    self.rl_steps.join(member)
                if (member.duet is not None or member.arrol is not None
                        or member.flags.darts is not None
                        or (member.group is not None and member.group.stopped)):
                    self._ruled[request.request_id] = member
        super().add_request(request)

    def _admit(self, request: Request, extra_args: dict) -> Member | None:
        """The engine's one read of a request's flags (the canonical form the front end
        wrote; :func:`vllm_rl.flags.read`).  Flags the front end did not vet (it was
        bypassed) that do not read are logged once and the request is served without
        them: they leave its params, so the workers' readers never see them either."""
        if not any(k == KEY or k.startswith(KEY + ".") for k in extra_args
                   if isinstance(k, str)):
            return None
        flags = self._flag_reads.read(extra_args, request.request_id, logger,
                                      default_group_id=request.request_id)
        if flags is None:
            params = request.sampling_params
            params.extra_args = {k: v for k, v in extra_args.items()
                                 if not (isinstance(k, str) and k.startswith(KEY))} or None
            return None
        member = Member(request.request_id, flags, weight_version=self.rl_weight_version)
        prompt, seed = request.prompt_token_ids, request.sampling_params.seed
        partial = flags.partial
        if partial is not None and partial.prior_tokens:
            # A continuation: its prompt is the original one and the tokens so far
            # (Member.prior); its techniques count the whole sample, its coins are the
            # uncarried sample's.
            seed = partial.seed
        if flags.duet is not None:
            original = prompt if not member.prior else prompt[:len(prompt) - member.prior]
            member.duet = self.duet.admit(
                flags.duet, request.max_tokens + member.prior, seed, original,
                request.request_id, prior=prompt[len(original):])
        if flags.arrol is not None:
            member.arrol = arrol.ArrolSample(request.request_id)
        return member

    @property
    def duet_thresholds(self):
        """DUET's online K1/K2 estimators per marker kind (:mod:`vllm_rl.duet.engine`)."""
        return self.duet.thresholds

    def _load_tokenizer(self):
        """The engine's tokenizer, for DUET's one read of the vocabulary (never to decode)."""
        from vllm.tokenizers import cached_tokenizer_from_config

        return cached_tokenizer_from_config(self.vllm_config.model_config)

    # ------------------------------------------------------------------ per step
    def update_from_output(self, scheduler_output, model_runner_output):
        """vLLM's own update, with the RL rules before and after it (no per-request hook
        inside vLLM's loop: a flagless request costs exactly what it costs on vLLM):

        * before: DAS's draft counts and ARRoL's verdicts of this step;
        * vLLM's body: tokens appended, its stop checks; a flagged sample that ended by
          itself gets its record as vLLM frees it (:meth:`_free_request`);
        * after: DAS's kept drafts; over the samples a rule may end only, ARRoL prunes,
          DUET's gate and marker, DARTS's early stop; each one ended is finished now
          (KV freed) with its record.
        """
        self.rl_step += 1
        members = self.rl_members
        if not members:
            return super().update_from_output(scheduler_output, model_runner_output)
        spec = scheduler_output.scheduled_spec_decode_tokens
        step = step_output.of(model_runner_output)
        if step is not None and step.drafting is not None:
            self.rl_das.decided(step.drafting, step.drafts_for)
        # the worker's draft counts under async scheduling (None: the scheduler's own
        # speculative tokens are the drafts)
        drafts = step.drafts if step is not None else None
        if self.rl_das.live:
            self.rl_das.count(members, self.requests, spec,
                              model_runner_output.sampled_token_ids,
                              model_runner_output.req_id_to_index, drafts)
        if step is not None and step.verdicts:
            self._take_verdicts(step.verdicts)
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        if spec and self.rl_das.live:
            self._keep_accepted(spec if drafts is None else drafts)
        self._apply_rules(scheduler_output.num_scheduled_tokens, outputs)
        if self._watched:
            self._check_watched()
        if self._stopped_groups:
            self._cancel_stopped_groups(outputs)
        if self.rl_steps:
            self._end_steps(outputs)
        if self._ended_early:
            self._ended_early = False
            self._restat(outputs)
        return outputs

    def _keep_accepted(self, verified) -> None:
        """DAS: of the drafts each sample verified this step (``verified``: the samples
        that did), the accepted ones it kept, before any rule writes its record."""
        requests, get = self.requests, self.rl_members.get
        for rid in verified:
            member = get(rid)
            if member is None or member.das is None or not member.das.step_accepted:
                continue
            request = requests.get(rid)
            if request is not None and not request.is_finished():
                das.keep_accepted(member.das, request.num_output_tokens)

    def _apply_rules(self, scheduled: dict, outputs: dict[int, EngineCoreOutputs]) -> None:
        """The per-sample rules after vLLM's update, for the ruled samples this step ran
        (:attr:`_ruled`): a pruned verdict ends it (ARRoL), else DUET's poll or gate
        may; a sample of an already stopped group still scheduled is cancelled.  Hot
        path: per ruled sample a dict lookup and a comparison unless a rule is due.  The
        loop walks the smaller of the step's requests and the ruled samples: with a long
        queue (thousands of samples waiting) it costs the batch, not the queue, and
        samples with DAS flags alone cost nothing."""
        ends: list[str] = []
        requests, ruled = self.requests, self._ruled
        if not ruled:
            ran = ()
        elif len(scheduled) < len(ruled):
            get = ruled.get
            ran = [(rid, m) for rid, m in zip(scheduled, map(get, scheduled)) if m is not None]
        else:
            ran = [(rid, m) for rid, m in ruled.items() if rid in scheduled]
        for rid, member in ran:
            request = requests.get(rid)
            if request is None or request.is_finished():
                continue
            state = member.duet
            if member.group is not None and member.group.stopped and not _tail(member):
                self._write_cancelled(request, member)
            elif member.arrol is not None and member.arrol.pending:
                member.arrol.pending = False
                self._record_end(request, member, Reason.ARROL_PRUNED)
            elif (state is not None
                  and request.num_output_tokens + member.prior >= state.next_check):
                reason = self.duet.step(state, request.num_output_tokens + member.prior,
                                        request.output_token_ids)
                if reason is None:
                    continue
                self._record_end(request, member, reason)
            else:
                continue
            ends.append(rid)
        if self._arrol_pending:                # pruned, but not run this step
            self._prune_pending(ends)
        if ends:
            self._finish_now(ends, outputs)

    def _take_verdicts(self, verdicts: dict) -> None:
        """ARRoL verdicts of this step: each sample's first one is kept (a request is
        scored once); a pruned sample ends at its update in this same step, unless its
        DARTS group would then keep fewer than M samples that can still be selected
        (composition rule: the coin is overruled).  Every sample scored while its group
        is at that floor is kept whatever its coin said, so no coin decided it: its
        record says ``floor`` and its survival weight is 1, not 1/p."""
        for rid, verdict in verdicts.items():
            member = self.rl_members.get(rid)
            sample = None if member is None else member.arrol
            if sample is None or sample.verdict is not None:
                continue
            verdict = arrol.verdict(verdict)
            if verdict.p is not None and _at_floor(member):
                sample.floor = True
                if verdict.pruned:
                    verdict = verdict._replace(pruned=False)
                    self.rl_stats["arrol_floor"] += 1
            sample.verdict = verdict
            if verdict.pruned:
                sample.pending = True
                self._arrol_pending.append(member)
            self.rl_stats["arrol_scored"] += 1

    def _prune_pending(self, ends: list[str]) -> None:
        """Pruned samples that did not run this step (a verdict for a request preempted
        since) end now too."""
        pending, self._arrol_pending = self._arrol_pending, []
        for member in pending:
            request = self.requests.get(member.request_id)
            if not member.arrol.pending or request is None or request.is_finished():
                continue
            member.arrol.pending = False
            self._record_end(request, member, Reason.ARROL_PRUNED)
            ends.append(member.request_id)

    def _check_watched(self) -> None:
        """Stop each watched group whose M shortest valid samples are now known."""
        for gid, group in list(self._watched.items()):
            live = []
            for m in group.live.values():
                if m.finish_rank is None and not _tail(m):
                    req = self.requests.get(m.request_id)
                    live.append(m.length(req.num_output_tokens if req is not None else 0))
            missing = max(0, group.flags.redundant - group.arrived)
            if darts.selection_final(group.finished, group.flags.size, live, missing):
                del self._watched[gid]
                group.stopped = True
                self.rl_stats["groups_resolved"] += 1
                self.rl_stats["stop_wait_steps"] += self.rl_step - group.full_at_step
                if live:
                    self.rl_stats["groups_stopped"] += 1
                    self._stopped_groups.append(group)

    def _free_request(self, request: Request, delay_free_blocks: bool = False):
        """Every end passes here (vLLM's stop checks, our early ends, client aborts).  A
        flagged sample that ended by itself (EOS, stop, length) gets its record now,
        before vLLM builds its final output, which carries ``stop_reason``."""
        member = self.rl_members.pop(request.request_id, None)
        self._ruled.pop(request.request_id, None)
        if member is not None and member.flags.das is not None:
            self.rl_das.leave()
        if member is not None:
            if not member.ended and request.status in _NATURAL:
                if member.das is not None and member.das.step_accepted:
                    das.keep_accepted(member.das, request.num_output_tokens)
                self._record_end(request, member, _natural_reason(request))
            self.rl_groups.leave(member)
            if member.duet is not None:
                self.duet.leave(member.duet)
            if member.flags.partial is not None and member.flags.partial.step is not None:
                group = member.group
                done = group.done if group is not None else not member.carried
                self.rl_steps.leave(member, request.num_output_tokens, int(done))
        return super()._free_request(request, delay_free_blocks)

    def rl_end_step(self, step: int) -> int:
        """End trainer step ``step`` now (:meth:`vllm_rl.engine.steps.StepBook.end`; the
        ``vllm_rl_end_step`` utility): its live samples are carried at the next update.
        The step is read as ``partial.step`` is (:func:`vllm_rl.flags.read_step`; the
        clients check it first, :mod:`vllm_rl.end_step`), never coerced."""
        return self.rl_steps.end(read_step(step))

    # ------------------------------------------------------------------ helpers
    def _record_end(self, request: Request, member: Member, reason: Reason) -> None:
        """A sample ended by itself or by its own policy: count it, maybe stop its group,
        and write its record."""
        member.ended = True
        group = member.group
        if group is not None:
            self.rl_groups.record_end(member, reason.valid and not _tail(member),
                                      member.length(request.num_output_tokens))
            self._watch(member)
        if member.duet is not None:
            self.duet.observe(member.duet, reason, member.length(request.num_output_tokens),
                              arrol.survival_weight(member.arrol))
        if reason is Reason.ARROL_PRUNED:
            self.rl_stats["arrol_pruned"] += 1
        records.write(request, member, reason)

    def _watch(self, member: Member) -> None:
        """Watch ``member``'s DARTS group from its M-th valid end on (its M shortest may
        be known at any later step)."""
        group, rl = member.group, member.flags
        if (not group.stopped and group.full_at_step is None
                and darts.watches(rl.darts, rl.group, group.valid)):
            group.full_at_step = self.rl_step
            self._watched[group.flags.id] = group

    def _write_cancelled(self, request: Request, member: Member) -> None:
        """A member of an early-stopped group: cancelled (DARTS Alg. 2 l.12)."""
        member.ended = True
        if member.duet is not None:
            self.duet.observe(member.duet, Reason.DARTS_CANCELLED,
                              member.length(request.num_output_tokens),
                              arrol.survival_weight(member.arrol))
        records.write(request, member, Reason.DARTS_CANCELLED)

    def _end_steps(self, outputs: dict[int, EngineCoreOutputs]) -> None:
        """Partial rollouts: the samples of each step whose rule now holds
        (:mod:`vllm_rl.engine.steps`) end now, ``carried`` (their group is not complete:
        it goes on in the next step, DUET's window sees the sample when it ends there),
        or ``stale`` past ``max_staleness`` (dropped: an end like a cancellation)."""
        ends: list[str] = []
        for state in self.rl_steps.due(self.requests):
            for rid, member in state.live.items():
                request = self.requests.get(rid)
                if member.ended or request is None or request.is_finished():
                    continue
                if stale(member):
                    self._record_end(request, member, Reason.STALE)
                else:
                    member.ended = member.carried = True
                    if member.group is not None:
                        member.group.carried += 1
                    records.write(request, member, Reason.CARRIED)
                ends.append(rid)
        if ends:
            self._finish_now(ends, outputs)

    def _cancel_stopped_groups(self, outputs: dict[int, EngineCoreOutputs]) -> None:
        """Finish the live members of early-stopped groups now and free their blocks."""
        groups, self._stopped_groups = self._stopped_groups, []
        for group in groups:
            members = [m for m in group.live.values() if not _tail(m)]
            for member in members:
                request = self.requests.get(member.request_id)
                if request is not None:
                    self._write_cancelled(request, member)
            self._finish_now([m.request_id for m in members], outputs)

def _tail(member: Member) -> bool:
    """A DARTS member DUET's coin kept past the gate: outside DARTS's pool (never counted
    toward M, never cancelled; :meth:`vllm_rl.duet.engine.DuetEngine.tail`)."""
    return (member.duet is not None and member.flags.darts is not None
            and DuetEngine.tail(member.duet))


def _at_floor(member: Member) -> bool:
    """Pruning ``member`` would leave its DARTS group fewer than M samples that can still
    be selected: valid ones that ended, live ones not being pruned (nor outside DARTS's
    pool: DUET's eps-kept), ones not yet arrived."""
    group = member.group
    if group is None or member.flags.darts is None:
        return False
    others = sum(1 for m in group.live.values()
                 if m is not member and not (m.arrol is not None and m.arrol.pending)
                 and not _tail(m))
    missing = max(0, group.flags.redundant - group.arrived)
    return group.valid + others + missing < group.flags.size


_NATURAL = (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH_CAPPED)


def _natural_reason(request: Request) -> Reason:
    if request.status == RequestStatus.FINISHED_LENGTH_CAPPED:
        return Reason.LENGTH
    return Reason.EOS if request.stop_reason is None else Reason.STOP


class RLScheduler(RLSchedulerMixin, AsyncScheduler):
    """The RL scheduler on vLLM's ``AsyncScheduler`` (the default RL engine, and DAS
    engines with ``DASConfig.async_scheduling``)."""

    def _update_after_schedule(self, scheduler_output) -> None:
        """With a drafter, vLLM's async scheduler gives every decoding request
        ``num_speculative_tokens`` placeholder drafts for its next step.  On an engine
        whose drafter is DAS's, only samples with DAS flags draft (the worker cuts theirs
        to their real drafts, ``patches/model_runner/das_async.py``): with none running, or while the
        drafter's last decision drafts for no row (its batch cap has drafting off: each
        step's output says, ``StepOutput.drafting``), no request gets placeholders;
        while it drafts for a few requests only (a probe of the cost cap:
        ``StepOutput.drafts_for``), only those keep theirs; otherwise those without DAS
        flags lose theirs.  No token budget or KV slots are held for drafts that never
        come.  Any other drafter (EAGLE, MTP, a draft model, ``ngram_gpu``) drafts for
        every request: vLLM's own scheduling, unchanged."""
        if not self.num_spec_tokens or not self.rl_das.drafter:
            return super()._update_after_schedule(scheduler_output)
        if not self.rl_das.schedules_drafts():
            scheduler_output.num_spec_tokens_to_schedule = 0
        super()._update_after_schedule(scheduler_output)
        if scheduler_output.num_spec_tokens_to_schedule:
            self.rl_das.cut_placeholders(scheduler_output.num_scheduled_tokens,
                                         self.requests, self.rl_members)


class RLSyncScheduler(RLSchedulerMixin, Scheduler):
    """The RL scheduler on vLLM's synchronous ``Scheduler`` (vLLM's CPU platform, and DAS
    engines with ``das={"async_scheduling": False}``)."""
