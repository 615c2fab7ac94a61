"""DASProposer: the DAS drafter as vLLM's ``custom_class`` speculative method.

vLLM calls :meth:`DASProposer.propose` after every decode step with the tokens each
running request just got (accepted drafts plus the bonus token); what it returns is
verified by the target model in the next step, by vLLM's own rejection sampler, so
the output distribution is the model's (lossless).  The patch
``patches/das_proposer_context.py`` hands the proposer the model runner and the step's
``SchedulerOutput`` first (:meth:`bind_step`): vLLM's ``custom_class`` interface
passes token arrays only, and DAS needs each row's request id and flags.

Per step, for each request whose flags have a ``das`` section:

1. *Feed* (Sec. 4.1.2): its new tokens extend its rollout in its problem's tree.  A
   rollout is sealed into the problem's window (:mod:`vllm_rl.das.store`) as soon as
   its tokens show a natural end (a stop token, ``max_tokens``, the model length), or
   when its request leaves the runner (cancelled, aborted, stopped by a string).  Only
   natural ends enter the length history the classes learn from: a DARTS-cancelled or
   DUET-aborted sample's length says nothing about how long it would have run.
2. *Account*: the drafts it was verified on and how many were accepted (per request,
   per problem and per verification round, see :meth:`stats`).
3. *Budget* (Sec. 4.2): ``policy="class"`` puts it in a length class, short / medium /
   long with budgets 0 / b / 2b, initialised from its problem's history and promoted as
   it grows (Sec. 4.2.3); ``"optimal"`` solves Eq. 6-7 over the running DAS requests
   from online estimates of their acceptance (Eq. 3) and remaining length;
   ``"fixed"`` always drafts 2b.  The batch cap then decides how much of it the step
   drafts (drafting stops paying on a big batch, Sec. 4.2.1): ``"phase"``
   (:func:`vllm_rl.das.caps.phase_budgets`, :meth:`DASProposer._phase`) gives each
   request the length that makes the next step cheapest per generated token on the
   engine's step-cost model, from its own acceptance estimate (Eq. 3's k): off or short
   in the bulk of a rollout step, the full budget in its tail; ``"cost"`` one length
   for all (:func:`vllm_rl.das.caps.cost_cap`); ``"linear"`` a fixed scale
   (:func:`vllm_rl.das.caps.batch_cap`).
4. *Draft*: the most frequent continuation of the longest context suffix that the
   tree has seen continued (the rollout itself is in the tree, so its own last
   occurrence never continues: the C++ draft backs off, by bisection, to the longest
   suffix that does).

Host cost.  Steps 1 and 4 for every row are one C++ call without the GIL
(:meth:`vllm_rl.das.store.ProblemTrees.feed_and_draft`): every growing rollout is
extended, then every row drafts from the trees as fed, with its own budget and
``min_prob``.  The per-request state is numpy columns (:class:`.slots.Slots`), so the
Python work of a step is a fixed number of array operations plus C-level ``map`` passes
over vLLM's lists (the row -> request lookup, flattening ``sampled_token_ids``).
Python runs per request only where it is amortised: a request's admission, its natural
end (stop token, ``max_tokens``: it is sealed in the store), its length-class check
every :data:`CLASS_CHECK_EVERY` tokens (``policy="class"``), its departure.  Two
settings stay per request per step: ``policy="optimal"`` (Eq. 6-7 fits (k, alpha) and
the expected remaining length per request in Python, ~10-20 µs per optimal request)
and ``batch_cap="phase"`` (the acceptance estimates are one vectorised bisection, but
:func:`vllm_rl.das.caps.phase_budgets` is a heap over the distinct (q, cap) pairs,
~1-3 µs per drafting request).  ``python -m vllm_rl.bench.das_host`` measures it.

Under vLLM's async scheduling (``DASConfig.async_scheduling``, ``patches/das_async.py``)
vLLM calls :meth:`propose` while the step's tokens are still on the device: the step
is noted (:meth:`after_sample`, :meth:`_begin_async`) and fed and drafted at the next
step's start (:meth:`before_step`), from each request's own context window
(:class:`~.context.ContextWindows`), which gives the drafts synchronous scheduling
gives.  A sample with ARRoL flags drafts nothing before its ``l_detect``-th token there:
under async speculative decoding the host learns how many drafts a step accepted only
after the next step was prepared, and ARRoL's scorer must know on the host which row
holds the sample's ``l_detect``-th token and which tokens its trace features read.

Requests without ``das`` flags get no draft and decode as on a stock engine.  A round
(one rollout batch) ends when no DAS request is left; its N_fwd, the most forward
passes any of its requests took (Eq. 4: the passes the batch needs), feeds T_short
(Sec. 4.2.3).  Classes are re-evaluated every :data:`CLASS_CHECK_EVERY` tokens.
"""
from __future__ import annotations

import operator
import time
from collections import Counter, deque
from dataclasses import asdict, dataclass, field
from itertools import chain, islice, repeat
from typing import Any

import numpy as np
from vllm.logger import init_logger

from vllm_rl.das import budget as policy
from vllm_rl.das import caps as draft_caps
from vllm_rl.cost import OnlineCost, load_cost
from vllm_rl.cost.host import WORKER as HOST     # the drafter's host time, for the trace
from vllm_rl.flags import DasFlags, RLFlags, read_or_warn
from vllm_rl.das.config import DASConfig, prompt_problem_id
from vllm_rl.das.context import ContextWindows
from vllm_rl.das.slots import CLASS, FIXED, OPTIMAL, POLICY_CODES, Slots
from vllm_rl.das.store import ProblemTrees
from vllm_rl.das.tree import draft_lists

logger = init_logger(__name__)

CLASS_CHECK_EVERY = 8    # tokens between length-class updates of a request
# The cost cap reads the acceptance of recent verifications; when it has drafted nothing
# for PROBE_EVERY steps (the trees may have grown since), one step drafts at full length
# for at most PROBE_ROWS requests: fresh evidence at the price of a few wider rows.
PROBE_EVERY = 16
PROBE_ROWS = 8
# Acceptance estimates of the phase-aware cap (Eq. 3's k, das.budget.estimate_k): a
# request's own counts shrunk toward its problem's, the problem's toward the engine's
# recent rate, each prior worth PRIOR_DRAFTS draft tokens; a problem's counts decay with
# a horizon of PROBLEM_HORIZON verifications (its tree and the policy move on).
PRIOR_DRAFTS = 16.0
PROBLEM_HORIZON = 256
PHASE_LOG = 256          # recent phase decisions kept for das_phase() (tests, debugging)
PATH_ATTR = "_vllm_rl_path_from"   # runner: a drafting step's path, vLLM's part from here
PREP_ATTR = "_vllm_rl_prep_ns"     # runner: that part, measured (patches/das_async.py)
HOST_DECAY = 0.1         # weight of the newest drafting step in draft_host_ms
# Async scheduling: a step's decision reaches the scheduler's placeholders this many steps
# later; an ARRoL hold ending within it already counts as drafting.
HOLD_LAG = 2


@dataclass
class RequestState:
    """One DAS request as the drafter tracks it: what is fixed at admission here, its
    counters in row ``slot`` of the drafter's :class:`~.slots.Slots` (the properties)."""

    problem: str
    seq: int
    flags: DasFlags
    max_tokens: int
    budget: int                         # b for this request
    min_prob: float
    slot: int
    slots: Slots = field(repr=False)
    init_class: str = policy.MEDIUM
    stop_ids: frozenset = frozenset()   # token ids that end it (EOS and stop tokens)
    budget_policy: str = "fixed"        # the budget policy (flags, else the engine's)

    @property
    def generated(self) -> int:         # output tokens fed so far
        return int(self.slots.generated[self.slot])

    @property
    def steps(self) -> int:             # forward passes that gave it tokens
        return int(self.slots.steps[self.slot])

    @property
    def done(self) -> bool:             # sealed: a natural end was seen
        return bool(self.slots.done[self.slot])

    @property
    def length_class(self) -> str:
        return policy.CLASSES[int(self.slots.rank[self.slot])]

    @property
    def est(self) -> policy.AcceptanceEstimate:
        """Its drafts: proposed, accepted, generated (Eq. 3's counts), a snapshot."""
        s, i = self.slots, self.slot
        return policy.AcceptanceEstimate(int(s.est_proposed[i]), int(s.est_accepted[i]),
                                         int(s.est_generated[i]))


@dataclass(frozen=True)
class PhaseStep:
    """One phase-aware decision (:meth:`DASProposer._phase`): the step's ``batch`` and mean
    ``context``, per drafting row its acceptance ``q``, draft ``caps`` (the tree's draft
    length within the policy budget) and chosen ``k``; ``verified``: draft tokens vLLM
    verified in this step (the previous decision's)."""

    step: int
    batch: int
    context: float
    q: tuple
    caps: tuple
    k: tuple
    verified: int
    probe: bool = False


@dataclass
class Round:
    """Totals of one rollout round (while any DAS request runs).  ``n_fwd`` is Eq. 4's
    N_fwd: the most forward passes one of its requests took."""

    steps: int = 0
    n_fwd: int = 0
    verifications: int = 0      # request-steps that verified a draft
    proposed: int = 0
    accepted: int = 0


@dataclass
class _Step:
    """One call's rows, as arrays over vLLM's rows (``n`` of them)."""

    n: int
    slots: np.ndarray           # int64: the row's slot, -1 for a request without DAS
    safe: np.ndarray            # slots with -1 replaced by 0 (for gathers; mask with das)
    tokens: np.ndarray          # int32: sampled_token_ids flattened
    offsets: np.ndarray         # int64 [n + 1]: row i's tokens are tokens[offsets[i]:...]
    feed: np.ndarray            # int32: tokens each row appends to its rollout
    ntok: np.ndarray            # int64: num_tokens_no_spec
    max_tokens: np.ndarray      # int32: the draft budget per row (0: no draft)


class DASProposer:
    """The ``custom_class`` proposer of a DAS engine (see the module docstring)."""

    def __init__(self, vllm_config: Any) -> None:
        cfg = DASConfig.from_vllm_config(vllm_config)
        if cfg is None:
            raise ValueError("DASProposer needs speculative_config.model = "
                             "'vllm_rl.das.drafter.DASProposer' (use vllm_rl.LLM(das=True))")
        self.cfg = cfg
        self.max_model_len = vllm_config.model_config.max_model_len
        self.k_max = vllm_config.speculative_config.num_speculative_tokens
        self.store = ProblemTrees(cfg.window, cfg.max_stored_tokens, cfg.max_depth)
        self.classes = policy.LengthClasses(horizon=cfg.round_horizon, history=cfg.history)
        self.requests: dict[str, RequestState | None] = {}   # None: not a DAS request
        self._owner: dict[str, Any] = {}    # request id -> the runner's state it was seen with
        self._slot_of: dict[str, int] = {}  # request id -> its slot (DAS requests)
        self._by_slot: dict[int, RequestState] = {}
        self.slots = Slots()
        self._running = 0                   # DAS requests not sealed yet
        self._stops: Counter = Counter()    # stop ids of the running requests
        self._stop_ids = np.zeros(0, dtype=np.int32)
        self._rows_key: tuple | None = None  # (req_ids, owners) the cached row slots are for
        self._row_slots = np.zeros(0, dtype=np.int64)
        self.round = Round()
        self.rounds = 0
        self.verify_log: deque = deque(maxlen=cfg.stats_rounds)  # per step (reqs, prop, acc)
        self.totals = Round()
        self.n_fwd_log: deque = deque(maxlen=cfg.round_horizon)
        self._runner = None
        self._sched = None
        extra = getattr(vllm_config, "additional_config", None) or {}
        self.cost = load_cost(extra.get("vllm_rl_cost"))   # the engine's step-cost model
        # Only the cost and phase caps read the model: fit it online only for them.
        self._online = cfg.batch_cap in ("cost", "phase") and isinstance(self.cost, OnlineCost)
        self._t_step: float | None = None
        self._batch, self._context = 0, 0.0    # this step's batch and mean context
        self._undrafted = 0                     # steps the cost cap has drafted nothing
        # phase cap: per-problem decayed acceptance counts (proposed, accepted, generated),
        # by problem key; a problem keeps its key (and counts) for the drafter's life
        self._problem_keys: dict[str, int] = {}
        self._problem_acc = np.zeros((64, 3))
        self._problem_seen = np.zeros(64, dtype=bool)
        self._steps = 0                         # propose() calls
        self._verified = 0                      # draft tokens verified in this step
        self.phase_log: deque = deque(maxlen=PHASE_LOG)
        self.phase_totals = {"decisions": 0, "drafting": 0, "probes": 0, "drafts": 0}
        self.cap_totals = {"decisions": 0, "off": 0}   # cost cap: steps, steps it said 0
        self._feeder = None                     # the background feed's thread
        self._pending = None                    # its call in flight (a Future)
        # async scheduling (patches/das_async.py): the step whose tokens are still on the
        # device, the drafts made from it, and the draft counts the last step verified
        self._windows = ContextWindows(cfg.max_depth, self.k_max + 1)
        self._sampled: _InFlight | None = None      # sampled, not proposed yet
        self._in_flight: list[_InFlight] = []       # proposed, not fed yet (oldest first)
        self._drafting = True                       # the last decision drafted for a row
        self._forcing = False                       # a request with das.force was seen
        self._draft_now = True                      # this decision's drafts are used
        self._wait_ns = 0                           # waited for the device, this step
        self._waited_at = 0                         # when the wait for the last ids ended
        self._path_ns: int | None = None            # the last drafting step's path so far
        # async: the host time a drafting step adds to the path (ms, decayed mean: the
        # drafter after its wait for the last step's ids, then vLLM's input preparation
        # until the forward pass, patches/das_async.py; the cost cap counts it against
        # the tokens drafting saves)
        self.draft_host_ms = 0.0
        self._ready: _Ready | None = None
        self._drafted: dict[str, int] = {}
        self.host_ns = {"feed": 0, "draft": 0, "feed_background": 0}  # the C++ calls' CPU time

    # ------------------------------------------------------------------ vLLM hooks
    def load_model(self, *args, **kwargs) -> None:
        """No draft model: the trees are the drafter (and survive weight reloads)."""

    @property
    def _asynchronous(self) -> bool:
        """The runner schedules asynchronously (vLLM's ``use_async_scheduling``)."""
        return bool(getattr(self._runner, "use_async_scheduling", False))

    def bind_step(self, runner: Any, scheduler_output: Any) -> None:
        """Called by ``patches/das_proposer_context.py`` before each :meth:`propose`."""
        self._runner, self._sched = runner, scheduler_output

    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu,
                slot_mappings=None):
        """vLLM's ``custom_class`` hook: each row's drafts.  Under async scheduling the
        step's tokens are still on the device: :meth:`_begin_async` keeps them and the
        drafts are made at the next step's start (:meth:`before_step`).  Its host time
        goes to the step trace (:data:`vllm_rl.cost.host.WORKER`)."""
        t0 = time.perf_counter_ns()
        try:
            runner = self._runner
            if runner is None:
                raise RuntimeError("DASProposer.propose called without bind_step: the "
                                   "vllm_rl das_proposer_context patch is not applied")
            if self._asynchronous:
                return self._begin_async(runner)
            self.settle()
            batch = runner.input_batch
            n = len(sampled_token_ids)
            req_ids = batch.req_ids if len(batch.req_ids) == n else list(batch.req_ids[:n])
            lens = np.fromiter(map(len, sampled_token_ids), dtype=np.int64, count=n)
            offsets = np.zeros(n + 1, dtype=np.int64)
            np.cumsum(lens, out=offsets[1:])
            tokens = np.fromiter(chain.from_iterable(sampled_token_ids), dtype=np.int32,
                                 count=int(offsets[-1]))
            self._retire(runner.requests)
            step = self._rows(list(map(runner.requests.get, req_ids)), batch, req_ids,
                              tokens, offsets,
                              np.asarray(num_tokens_no_spec[:n], dtype=np.int64))
            drafted = _scheduled_drafts(self._sched, req_ids, n)
            res = self._run(req_ids, step, drafted, _contexts(token_ids_cpu),
                            step.ntok.astype(np.int32))
            return draft_lists(res.drafts, res.lengths)
        finally:
            HOST.drafter_ns += time.perf_counter_ns() - t0

    def _run(self, req_ids, step: _Step, drafted: np.ndarray, contexts: np.ndarray,
             context_len: np.ndarray, draft: bool = True):
        """One step of the drafter over its rows (module docstring, steps 1-4): the
        drafts as :class:`~vllm_rl.das.tree.BatchDrafts` (none without ``draft``: the
        budgets are decided, :attr:`_drafting` says whether any row would draft, and
        the rows are only fed)."""
        sched = self._sched
        S = self.slots
        self._draft_now = draft
        das = step.slots >= 0
        active = das & ~S.done[step.safe] & (np.diff(step.offsets) > 0)
        step_reqs, step_prop, step_acc = self._verify(step, active, drafted)
        live = self._feed(step, active)
        self._account(step_reqs, step_prop, step_acc, bool(len(live)))
        self._maybe_end_round()
        self._steps += 1
        self._verified = step_prop
        phase = None
        if len(live):
            if self._online:
                self._observe_step(sched, req_ids, step.ntok)
            self._batch = len(req_ids)
            self._context = float(step.ntok.sum()) / max(self._batch, 1)
            forced = live[S.force[step.slots[live]]] if self._forcing else live[:0]
            if len(forced):                       # das.force: past the batch cap
                live = live[~S.force[step.slots[live]]]
            if len(live) and self.cfg.batch_cap == "phase":
                phase = self._phase(live, step)
            elif len(live):
                self._budget_rows(live, step)
            if len(forced):
                step.max_tokens[forced] = self._room(forced, step,
                                                     self._budgets(forced, step, 1.0))
        hold = S.hold[step.safe]
        soon = None
        if hold.any():           # ARRoL samples under async scheduling (module docstring)
            generated = S.generated[step.safe]
            held = das & (generated < hold)
            # a row released within the scheduler's lag counts as drafting now, so its
            # placeholders are there the step its hold ends
            soon = step.max_tokens[held & (generated + HOLD_LAG >= hold)].any()
            step.max_tokens[held] = 0
        # whether the next async step waits to draft: not while live rows all got 0; a
        # decision to draft made while only feeding holds until a drafting step uses it
        decided = bool(step.max_tokens.any() or soon) if len(live) else True
        self._drafting = decided if draft else (self._drafting or decided)
        if not draft:
            step.max_tokens[:] = 0
            phase = None
        seqs = np.where(das, S.seq[step.safe], -1)
        later = None
        if self.cfg.background_feed:        # rows drafting nothing: fed off the step's path
            later = step.feed * (step.max_tokens <= 0)
            step.feed -= later
        res = self.store.feed_and_draft(
            seqs, step.tokens, step.offsets, step.feed, contexts, context_len,
            step.max_tokens, S.min_prob[step.safe], backoff=True)
        self.host_ns["feed"] += res.feed_ns
        self.host_ns["draft"] += res.draft_ns
        if later is not None and later.any():
            self._feed_in_background(seqs, step.tokens, step.offsets, later)
        if phase is not None:
            self._phase_cut(phase, res.lengths)
        return res

    # ------------------------------------------------------------------ async scheduling
    @property
    def drafting(self) -> bool:
        """Under async scheduling: whether the drafter's last decision drafted for a row
        (:meth:`before_step` waits and drafts only then).  Each step's output carries it
        to the scheduler, which gives DAS samples placeholder drafts only while it holds
        (``RLScheduler._update_after_schedule``): where the batch cap has drafting off,
        no KV slots or token budget are held for drafts that never come."""
        return self._drafting

    def after_sample(self, runner, sampled) -> None:
        """Step n sampled, under async scheduling (``patches/das_async.py``, before
        vLLM's bookkeeping).  ``sampled`` (``[rows, k + 1]``, -1 past a row's accepted
        tokens) is on the device: give vLLM, there, each row's last token and count
        (what its async speculative path reads when it prepares step n + 1) and start
        the ids' copy to the host."""
        import torch

        t0 = time.perf_counter_ns()
        n = sampled.shape[0]
        discard = runner.discard_request_mask.np[:n].copy()
        counts = (sampled >= 0).sum(dim=1, dtype=torch.int32)
        if discard.any():
            counts.masked_fill_(torch.from_numpy(discard).to(counts.device), 0)
        last = sampled.gather(1, (counts.long() - 1).clamp_(min=0).unsqueeze(1))
        runner._copy_valid_sampled_token_count(last.squeeze(1).to(torch.int32), counts)
        host, event = _to_host(sampled)
        self._sampled = _InFlight(sampled=host, event=event, discard=discard)
        HOST.drafter_ns += time.perf_counter_ns() - t0

    def _begin_async(self, runner):
        """vLLM's ``propose`` at the end of step n under async scheduling: note the
        step's rows as they are now (the runner moves on before they are fed); no drafts
        yet (:meth:`before_step` makes them)."""
        import torch

        f, self._sampled = self._sampled, None
        n = f.sampled.shape[0]
        batch = runner.input_batch
        f.req_ids = list(batch.req_ids[:n])
        f.owners = list(map(runner.requests.get, f.req_ids))
        f.n_prompt = np.asarray(batch.num_prompt_tokens[:n], dtype=np.int64).copy()
        f.sched = self._sched
        f.drafted = np.fromiter(map(self._drafted.get, f.req_ids, repeat(0)), np.int64, n)
        self._in_flight.append(f)
        return torch.zeros((n, self.k_max), dtype=torch.int32, device=runner.device)

    def _catch_up(self, draft: bool) -> None:
        """Feed the async steps whose tokens were not fed yet, in order; with ``draft``,
        all of them, the last one drafting for the next step (:attr:`_ready`); without,
        all but the last (their copies are done: no wait)."""
        todo = self._in_flight[:] if draft else self._in_flight[:-1]
        if not todo:
            return
        del self._in_flight[:len(todo)]
        for j, f in enumerate(todo):
            self._feed_async(f, draft and j == len(todo) - 1)
        # the last step's rows may still be fed on the feeder thread, the queued ones are
        # not fed yet: their requests are sealed at a later step, once fed
        keep = set(todo[-1].req_ids).union(*(f.req_ids for f in self._in_flight))
        self._retire(self._runner.requests, keep)

    def _feed_async(self, f: "_InFlight", draft: bool) -> None:
        """One async step's tokens on the host: feed them and, with ``draft``, draft for
        the step after it, as :meth:`propose` does under synchronous scheduling (the same
        drafts: the contexts come from :class:`~.context.ContextWindows`)."""
        if f.event is not None:
            t0 = time.perf_counter_ns()
            f.event.synchronize()
            self._wait_ns += time.perf_counter_ns() - t0
        if draft:                # the path starts here: the device has nothing queued
            self._waited_at = time.perf_counter_ns()
        self._wait_feed()
        arr = f.sampled.numpy()
        valid = arr >= 0
        valid[f.discard] = False
        n = len(f.req_ids)
        lens = valid.sum(axis=1)
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lens, out=offsets[1:])
        tokens = arr[valid].astype(np.int32)
        sched, self._sched = self._sched, f.sched
        try:
            step = self._rows(f.owners, None, f.req_ids, tokens, offsets, None)
            S, win = self.slots, self._windows
            step.ntok = f.n_prompt + lens + np.where(step.slots >= 0, S.generated[step.safe], 0)
            win.append(np.where(S.done[step.safe], -1, step.slots), tokens, offsets)
            contexts, context_len = win.view(step.slots)
            res = self._run(f.req_ids, step, f.drafted, contexts, context_len, draft)
        finally:
            self._sched = sched
        if draft:
            self._ready = _Ready(rows={rid: i for i, rid in enumerate(f.req_ids)},
                                 drafts=res.drafts, lengths=res.lengths, sched=f.sched)

    def before_step(self, runner: Any, scheduler_output: Any):
        """Called by ``patches/das_async.py`` before each step of an async engine.

        When the step verifies drafts (the scheduler gave DAS samples placeholder slots)
        and the drafter drafted at its last decision, wait for the last step's tokens,
        feed them and draft (:meth:`_catch_up`), put the drafts where vLLM's async path
        reads them (``runner._draft_token_ids``, by the previous step's rows).  Otherwise
        only the steps before the last are fed (no wait: the forward pass runs on), and
        the step verifies no drafts; a drafter that starts drafting again does so one
        step late.

        Returns the scheduler output as the worker runs it (each request's speculative
        slots cut to its draft: vLLM's scheduler gave every DAS sample
        ``num_speculative_tokens`` placeholders, and vLLM's ngram_gpu path cuts them the
        same way), the requests whose slots were cut (with the scheduler's count), and
        the exact draft counts (the step's output carries them to the scheduler for the
        records, :func:`vllm_rl.das.engine.count_drafts`)."""
        t0 = time.perf_counter_ns()
        try:
            self._runner = runner
            prep = runner.__dict__.pop(PREP_ATTR, None)
            if self._path_ns is not None and prep is not None:
                ms = (self._path_ns + prep) / 1e6      # the last drafting step's path
                self.draft_host_ms += HOST_DECAY * (ms - self.draft_host_ms)
            self._path_ns = None
            spec = scheduler_output.scheduled_spec_decode_tokens
            draft = bool(spec) and self._drafting
            self._wait_ns = self._waited_at = 0
            self._catch_up(draft)
            ready, self._ready = self._ready, None
            self._drafted = {}
            if not spec:
                return scheduler_output, {}, None
            rows = ready.rows if ready is not None else {}
            get = rows.get
            counts, cut = {}, {}
            for rid, toks in spec.items():
                i = get(rid)
                k = 0 if i is None else min(int(ready.lengths[i]), len(toks))
                if k:
                    counts[rid] = k
                if k < len(toks):
                    cut[rid] = len(toks)
            self._drafted = counts
            if ready is not None:
                _upload(runner, ready, self.k_max)
            if not cut:
                return scheduler_output, {}, counts
            return _trimmed(scheduler_output, counts, cut), cut, counts
        finally:
            end = time.perf_counter_ns()
            path = end - self._waited_at if self._waited_at else 0
            HOST.drafter_ns += end - t0 - path
            HOST.path_ns += path
            if path:                 # vLLM's input preparation goes on the path too
                self._path_ns = path
                runner.__dict__[PATH_ATTR] = end

    # ------------------------------------------------------------------ background feed
    def _feed_in_background(self, seqs, tokens, offsets, feed) -> None:
        """Feed these rows' new tokens on the feeder thread (the C++ call releases the
        GIL); :meth:`settle` waits for it."""
        if self._feeder is None:
            from concurrent.futures import ThreadPoolExecutor

            self._feeder = ThreadPoolExecutor(1, thread_name_prefix="vllm_rl-das-feed")
        n = len(seqs)
        self._pending = self._feeder.submit(
            self.store.feed_and_draft, seqs, tokens, offsets, feed,
            np.zeros((n, 1), np.int32), np.zeros(n, np.int32), np.zeros(n, np.int32),
            np.zeros(n), True)

    def settle(self) -> None:
        """Before anything reads or changes the trees (the ``das_*`` calls): finish an
        async step whose tokens were not fed yet (its drafts wait for the next step) and
        wait for the background feed."""
        if self._in_flight:
            self._catch_up(draft=True)
        self._wait_feed()

    def _wait_feed(self) -> None:
        """Wait for the background feed of the last step.  Its time off the step's path
        is in ``host_ns["feed_background"]``; the time waited here is on it."""
        pending, self._pending = self._pending, None
        if pending is not None:
            self.host_ns["feed_background"] += pending.result().feed_ns

    # ------------------------------------------------------------------ rows
    def _rows(self, owners, batch, req_ids, tokens, offsets, ntok) -> _Step:
        """The step's rows as arrays (row ``i``, request ``req_ids[i]`` with the runner's
        state ``owners[i]``, got ``tokens[offsets[i]:offsets[i+1]]``); admits the
        requests seen for the first time (and a new request under a reused id).  C-level
        passes over vLLM's lists only: a request's own Python runs at its admission."""
        n = len(req_ids)
        key = self._rows_key
        if (key is None or key[0] != req_ids or len(key[1]) != n
                or not all(map(operator.is_, owners, key[1]))):
            known = np.fromiter(map(operator.is_, owners, map(self._owner.get, req_ids)),
                                dtype=bool, count=n)
            for i in np.flatnonzero(~known).tolist():
                self._state(req_ids[i], owners[i], batch, i)
            self._row_slots = np.fromiter(map(self._slot_of.get, req_ids, repeat(-1)),
                                          dtype=np.int64, count=n)
            self._rows_key = (list(req_ids), owners)
        slots = self._row_slots
        return _Step(n=n, slots=slots, safe=np.maximum(slots, 0), tokens=tokens,
                     offsets=offsets, feed=np.zeros(n, dtype=np.int32), ntok=ntok,
                     max_tokens=np.zeros(n, dtype=np.int32))

    def _verify(self, step: _Step, active, drafted: np.ndarray) -> tuple[int, int, int]:
        """Eq. 3's counts: per row that was verified on a draft (``active``, ``drafted``
        tokens), the draft tokens and how many were accepted (all sampled tokens but
        the bonus one); returns the step's (requests, proposed, accepted)."""
        rows = np.flatnonzero(active & (drafted > 0))
        if not len(rows):
            return 0, 0, 0
        s = step.slots[rows]
        d = drafted[rows]
        g = np.diff(step.offsets)[rows]
        a = np.minimum(g - 1, d)
        S = self.slots
        S.est_proposed[s] += d
        S.est_accepted[s] += a
        S.est_generated[s] += g
        S.pend_drafted[s] += d
        S.pend_accepted[s] += a
        if self.cfg.batch_cap == "phase":
            self._observe_problems(S.problem_key[s], d, a, g)
        return len(rows), int(d.sum()), int(a.sum())

    def _feed(self, step: _Step, active) -> np.ndarray:
        """Count each active row's new tokens (cut after a stop token: the tokens after it
        are not the sample's) and seal the rollouts that ended naturally (fed here, one
        by one: once per request).  The others are fed by the step's batched call
        (``step.feed``).  Returns the rows that go on."""
        rows = np.flatnonzero(active)
        if not len(rows):
            return rows
        S = self.slots
        feed = step.feed
        feed[rows] = np.diff(step.offsets)[rows]
        stopped = np.zeros(step.n, dtype=bool)
        if len(self._stop_ids) and len(step.tokens):
            hit = np.flatnonzero(np.isin(step.tokens, self._stop_ids))
            if len(hit):                     # a stop id of some request: check the row's own
                for i in np.unique(np.searchsorted(step.offsets, hit, side="right") - 1):
                    if not active[i]:
                        continue
                    stop = self._by_slot[int(step.slots[i])].stop_ids
                    row = step.tokens[step.offsets[i]:step.offsets[i + 1]].tolist()
                    end = next((j + 1 for j, t in enumerate(row) if t in stop), None)
                    if end is not None:
                        feed[i], stopped[i] = end, True
        s = step.slots[rows]
        S.generated[s] += feed[rows]
        S.steps[s] += 1
        ends = stopped[rows] | (S.generated[s] >= S.max_tokens[s]) | \
            (step.ntok[rows] >= self.max_model_len)
        for i in rows[ends].tolist():
            st = self._by_slot[int(step.slots[i])]
            start = int(step.offsets[i])
            self.store.extend(st.problem, st.seq,
                              step.tokens[start:start + int(feed[i])].tolist())
            feed[i] = 0
            self._finish(st, natural=True)
        return rows[~ends]

    # ------------------------------------------------------------------ step cost
    def _observe_step(self, sched, req_ids, ntok: np.ndarray) -> None:
        """Feed the online cost model the step that just ran (time since the last one)."""
        now = time.perf_counter()
        last, self._t_step = self._t_step, now
        sched_tokens = getattr(sched, "num_scheduled_tokens", None) or {}
        if last is None or not sched_tokens or now - last > 1.0:   # idle gap: no sample
            return
        widths = np.fromiter(map(sched_tokens.get, req_ids, repeat(0)), dtype=np.int64,
                             count=len(req_ids))
        contexts = np.maximum(ntok - widths, 0)
        self.cost.observe_sums(int(widths.sum()), int((widths * (contexts + widths)).sum()),
                               (now - last) * 1e3)

    def _cost_cap(self, batch: int, drafting: int) -> int:
        """Sec. 4.2.1's batch cap from the step-cost model: the draft length that makes
        this step cheapest per generated token (:func:`.caps.cost_cap`), host time
        counted: under async scheduling a drafting step also pays :attr:`draft_host_ms`
        (the drafter's time after the forward pass, measured), which a step without
        drafts hides under the forward pass."""
        q = self._recent_acceptance()
        width = lambda k: 1.0 + k * drafting / batch   # noqa: E731
        host = self.draft_host_ms if self._asynchronous else 0.0

        def step_ms(k: int) -> float:
            return self.cost.uniform_ms(batch, width(k), self._context) + (host if k else 0.0)

        return draft_caps.cost_cap(step_ms, batch, drafting, q, self.k_max)

    def _recent_acceptance(self) -> float:
        """The engine's per-draft-token acceptance over its last 64 verification steps
        (:func:`policy.chain_acceptance`), clamped to [0.05, 0.95]; 0.5 before any."""
        recent = list(islice(reversed(self.verify_log), 64))
        prop = sum(x[1] for x in recent)
        acc = sum(x[2] for x in recent)
        q = policy.chain_acceptance(prop, acc, acc + sum(x[0] for x in recent))
        return 0.5 if q is None else min(max(q, 0.05), 0.95)

    def _observe_problems(self, keys, proposed, accepted, generated) -> None:
        """Each verification's counts into its problem's decayed counts, in row order: a
        problem verified m times in this step keeps keep^m of its counts and the j-th
        verification (0-based) weighs keep^(m-1-j), keep = 1 - 1/PROBLEM_HORIZON, as m
        successive updates would."""
        keep = 1.0 - 1.0 / PROBLEM_HORIZON
        order = np.argsort(keys, kind="stable")
        k = keys[order]
        starts = np.flatnonzero(np.r_[True, k[1:] != k[:-1]])
        counts = np.diff(np.r_[starts, len(k)])
        rank = np.arange(len(k)) - np.repeat(starts, counts)
        w = keep ** (np.repeat(counts, counts) - 1 - rank)
        uk = k[starts]
        acc = self._problem_acc
        acc[uk] *= (keep ** counts)[:, None]
        for col, v in enumerate((proposed, accepted, generated)):
            acc[uk, col] += np.add.reduceat(v[order] * w, starts)
        self._problem_seen[uk] = True

    def _acceptance(self, slots: np.ndarray) -> np.ndarray:
        """Eq. 3's k per request (:func:`policy.estimate_k_many`): its own drafts' counts,
        shrunk toward its problem's (decayed) counts, shrunk toward the engine's recent
        rate.  Vectorised: one bisection over the step's problems, one over its
        requests."""
        S = self.slots
        q_engine = self._recent_acceptance()
        keys, inv = np.unique(S.problem_key[slots], return_inverse=True)
        counts = self._problem_acc[keys]
        q_p = np.where(self._problem_seen[keys],
                       policy.estimate_k_many(counts[:, 0], counts[:, 1], counts[:, 2],
                                              q_engine, PRIOR_DRAFTS), q_engine)[inv]
        own = S.est_proposed[slots] > 0
        q = q_p.copy()
        if own.any():
            s = slots[own]
            q[own] = policy.estimate_k_many(S.est_proposed[s], S.est_accepted[s],
                                            S.est_generated[s], q_p[own], PRIOR_DRAFTS)
        return q

    # ------------------------------------------------------------------ budgets
    def _budget_rows(self, live: np.ndarray, step: _Step) -> None:
        """The cost and linear caps: ``step.max_tokens`` for the rows that draft."""
        if self.cfg.batch_cap == "cost":
            cap, k_cap = 1.0, self._cost_cap(step.n, len(live))
            self.cap_totals["decisions"] += 1
            self.cap_totals["off"] += k_cap == 0
            if k_cap == 0:
                self._undrafted += 1
                if self._undrafted >= PROBE_EVERY:       # fresh acceptance evidence
                    k_cap = self.k_max
                    if self._draft_now:                  # (a probe only counts if drafted)
                        self._undrafted = 0
                    live = live[:PROBE_ROWS]
            else:
                self._undrafted = 0
        else:
            cap = draft_caps.batch_cap(step.n, self.cfg.full_batch, self.cfg.off_batch)
            k_cap = self.k_max
        if cap <= 0.0 or k_cap <= 0:
            return
        budgets = np.minimum(self._budgets(live, step, cap), k_cap)
        step.max_tokens[live] = self._room(live, step, budgets)

    def _budgets(self, rows: np.ndarray, step: _Step, cap: float) -> np.ndarray:
        """Each row's policy budget (fixed 2b, class 0/b/2b, Eq. 7), scaled by ``cap``."""
        S = self.slots
        s = step.slots[rows]
        pol = S.policy[s]
        out = np.where(pol == FIXED, 2 * S.budget[s], 0)
        cls = np.flatnonzero(pol == CLASS)
        if len(cls):
            sc = s[cls]
            due = (S.generated[sc] >= S.next_check[sc]) & (S.rank[sc] != 2)
            for slot in sc[due].tolist():        # every CLASS_CHECK_EVERY tokens
                self._update_class(self._by_slot[slot])
            out[cls] = S.class_budget[sc]
        opt = np.flatnonzero(pol == OPTIMAL)
        if len(opt):
            self._optimal(s[opt], opt, out)
        return np.minimum(self.k_max, np.floor(out * cap + 0.5).astype(np.int64))

    def _update_class(self, st: RequestState) -> None:
        """Sec. 4.2.3's runtime promotion of one request (short -> medium -> long)."""
        S, i = self.slots, st.slot
        S.next_check[i] = S.generated[i] + CLASS_CHECK_EVERY
        cur = st.length_class
        new = self.classes.update(cur, int(S.generated[i]), st.init_class, st.max_tokens)
        if new != cur:
            S.rank[i] = policy.CLASSES.index(new)
            S.class_budget[i] = self.classes.budget(new, st.budget)

    def _room(self, rows: np.ndarray, step: _Step, budgets: np.ndarray) -> np.ndarray:
        """``budgets`` within what each row's request may still verify (the model length,
        its max_tokens; one token of each step is the sampled one)."""
        S = self.slots
        s = step.slots[rows]
        room = np.minimum(self.max_model_len - step.ntok[rows] - 1,
                          S.max_tokens[s] - S.generated[s] - 1)
        return np.maximum(0, np.minimum(budgets, room))

    def _optimal(self, slots: np.ndarray, idx: np.ndarray, out: np.ndarray) -> None:
        """Eq. 6-7 over the running ``optimal`` requests: l_i = expected remaining length
        (the problem's window, conditioned on the length so far), (k_i, alpha_i) fitted
        online to Eq. 3 from the request's own drafts.  Per request in Python (the fits
        and :func:`policy.optimal_budgets`): the one policy whose step cost grows with
        its requests in Python, ~10-20 µs each."""
        ls, ks, alphas = [], [], []
        states = [self._by_slot[s] for s in slots.tolist()]
        for st in states:
            ls.append(max(1.0, self._expected_remaining(st)))
            k, a = policy.estimate_k_alpha(st.est)
            ks.append(k)
            alphas.append(a)
        c_base, c_tok = self._eq1_costs(self._batch)
        n_fwd, totals = policy.optimal_budgets(ls, ks, alphas, c_base, c_tok)
        for j, st, p in zip(idx.tolist(), states, totals):
            out[j] = policy.step_budget(p, max(n_fwd, 1.0), 2 * st.budget)

    def _eq1_costs(self, batch: int) -> tuple[float, float]:
        """Eq. 1's (c_base, c_tok) for Eq. 7: the cost model linearised at this step's
        batch (:meth:`StepCost.linear_at`), or the configured constants while an online
        model has not been fitted yet."""
        if isinstance(self.cost, OnlineCost) and not self.cost.fitted and self.cost.prior is None:
            return self.cfg.c_base_ms, self.cfg.c_tok_ms
        return self.cost.linear_at(batch, self._context)

    def _expected_remaining(self, st: RequestState) -> float:
        generated = st.generated
        longer = [n for n in self.store.lengths(st.problem) if n > generated]
        if longer:
            return sum(longer) / len(longer) - generated
        return (self.classes.t_med(st.max_tokens) if generated < self.classes.t_med(
            st.max_tokens) else st.max_tokens) - generated

    # ------------------------------------------------------------------ phase cap
    def _phase(self, live: np.ndarray, step: _Step):
        """Phase-aware drafting (:func:`.caps.phase_budgets`): the draft length per request
        that makes the next step cheapest per generated token on the step-cost model, at
        this step's batch and mean context, from each request's acceptance estimate
        (Eq. 3's k) and within its policy's budget (fixed 2b, class 0/b/2b, Eq. 7).

        First with the budgets as caps (if nothing pays, nothing is drafted: the tree is
        not even asked); then the tree drafts the requests that got a length, and
        :meth:`_phase_cut` runs the rule again with what the tree actually had (a draft
        can stop early: no match, or the cumulative-probability cutoff) and cuts the
        drafts to it.  Returns what the cut needs (None: no draft this step)."""
        batch, context = self._batch, self._context
        curve = [self.cost.uniform_ms(batch, 1 + k, context) for k in range(self.k_max + 1)]
        step_ms = curve.__getitem__
        caps = self._room(live, step, self._budgets(live, step, 1.0))
        q = self._acceptance(step.slots[live])
        ks = np.asarray(draft_caps.phase_budgets(step_ms, batch, q.tolist(), caps.tolist()),
                        dtype=np.int64)
        probe = False
        if not ks.any():
            self._undrafted += 1
            if self._undrafted < PROBE_EVERY:
                self._log_phase(batch, context, q.tolist(), caps.tolist(), ks.tolist(), False)
                return None
            # fresh acceptance evidence: the requests with the fewest drafts so far
            probe = True
            if self._draft_now:
                self._undrafted = 0
            order = np.argsort(self.slots.est_proposed[step.slots[live]], kind="stable")
            ks = np.zeros(len(live), dtype=np.int64)
            ks[order[:PROBE_ROWS]] = caps[order[:PROBE_ROWS]]
        else:
            self._undrafted = 0
        pick = np.flatnonzero(ks > 0)
        rows = live[pick]
        step.max_tokens[rows] = caps[pick]
        return step_ms, batch, context, rows, q[pick], probe

    def _phase_cut(self, phase, lengths: np.ndarray) -> None:
        step_ms, batch, context, rows, q, probe = phase
        got = lengths[rows].astype(np.int64)
        if probe:
            self._log_phase(batch, context, q.tolist(), got.tolist(), got.tolist(), True)
            return
        ks = draft_caps.phase_budgets(step_ms, batch, q.tolist(), got.tolist())
        lengths[rows] = np.minimum(got, ks)
        self._log_phase(batch, context, q.tolist(), got.tolist(), ks, False)

    def _log_phase(self, batch, context, q, caps, ks, probe: bool) -> None:
        drafted = sum(ks)
        t = self.phase_totals
        t["decisions"] += 1
        t["drafting"] += drafted > 0
        t["probes"] += probe
        t["drafts"] += drafted
        self.phase_log.append(PhaseStep(self._steps, batch, context, tuple(q), tuple(caps),
                                        tuple(ks), self._verified, probe))

    # ------------------------------------------------------------------ requests
    def _state(self, rid: str, cached: Any, batch: Any, i: int) -> None:
        """A request seen for the first time (or a new request under a reused id)."""
        if rid in self.requests:
            self._seal(rid)                      # the id was reused by a new request
        st = None
        params = getattr(cached, "sampling_params", None)
        flags = _das_flags(getattr(params, "extra_args", None), rid)
        if flags is not None and flags.das is not None:
            st = self._start(flags.das, params, cached, batch, i)
            if flags.arrol is not None and self._asynchronous:
                self.slots.hold[st.slot] = flags.arrol.l_detect
            self._slot_of[rid] = st.slot
            self._by_slot[st.slot] = st
        self.requests[rid] = st
        self._owner[rid] = cached

    def _start(self, flags: DasFlags, params, cached, batch, i) -> RequestState:
        prompt = cached.prompt_token_ids or []
        n_prompt = len(prompt) if prompt or batch is None else int(batch.num_prompt_tokens[i])
        problem = flags.problem_id or prompt_problem_id(prompt)
        tail = list(prompt[max(0, n_prompt - self.cfg.prompt_tail):n_prompt])
        seq = self.store.start(problem, tail)
        max_tokens = params.max_tokens or (self.max_model_len - n_prompt)
        b = self.cfg.budget if flags.budget is None else min(flags.budget, self.cfg.budget)
        init = self.classes.initial(self.store.lengths(problem), max_tokens)
        stop_ids = set(params.all_stop_token_ids or ())
        if params.eos_token_id is not None and not params.ignore_eos:
            stop_ids.add(params.eos_token_id)
        name = flags.policy or self.cfg.policy
        S = self.slots
        slot = S.take()
        st = RequestState(
            problem=problem, seq=seq, flags=flags, max_tokens=max_tokens, budget=b,
            min_prob=self.cfg.min_prob if flags.min_prob is None else flags.min_prob,
            slot=slot, slots=S, init_class=init, stop_ids=frozenset(stop_ids),
            budget_policy=name)
        S.seq[slot], S.max_tokens[slot], S.budget[slot] = seq, max_tokens, b
        S.policy[slot] = POLICY_CODES.get(name, FIXED)
        S.rank[slot] = policy.CLASSES.index(init)
        S.class_budget[slot] = self.classes.budget(init, b)
        S.min_prob[slot] = st.min_prob
        if flags.force:
            S.force[slot] = True
            self._forcing = True
        S.problem_key[slot] = self._problem_key(problem)
        if self._asynchronous:
            self._windows.start(slot, prompt[max(0, n_prompt - self.cfg.max_depth):n_prompt])
        self._running += 1
        self._add_stops(st.stop_ids, 1)
        return st

    def _problem_key(self, problem: str) -> int:
        key = self._problem_keys.get(problem)
        if key is None:
            key = self._problem_keys[problem] = len(self._problem_keys)
            if key >= len(self._problem_seen):
                self._problem_acc = np.concatenate([self._problem_acc,
                                                    np.zeros_like(self._problem_acc)])
                self._problem_seen = np.concatenate([self._problem_seen,
                                                     np.zeros_like(self._problem_seen)])
        return key

    def _add_stops(self, ids: frozenset, sign: int) -> None:
        """The stop ids any running request has (a token among them is checked against
        its own row's stop ids)."""
        before = len(self._stops)
        for t in ids:
            self._stops[t] += sign
            if self._stops[t] <= 0:
                del self._stops[t]
        if ids and (sign < 0 or len(self._stops) != before):
            self._stop_ids = np.array(sorted(self._stops), dtype=np.int32)

    def _finish(self, st: RequestState, natural: bool) -> None:
        self._flush(st)
        self.store.finish(st.problem, st.seq, st.generated, natural)
        if natural:
            self.classes.observe_final(st.init_class, st.generated, st.max_tokens)
        self.round.n_fwd = max(self.round.n_fwd, st.steps)
        self.slots.done[st.slot] = True
        self._running -= 1
        self._add_stops(st.stop_ids, -1)

    def _flush(self, st: RequestState) -> None:
        """Its drafts' counts into its problem's totals (kept per request between)."""
        S, i = self.slots, st.slot
        d, a = int(S.pend_drafted[i]), int(S.pend_accepted[i])
        if d or a:
            S.pend_drafted[i] = S.pend_accepted[i] = 0
            p = self.store.problems.get(st.problem)
            if p is not None:
                p.drafted += d
                p.accepted += a

    def _flush_all(self) -> None:
        for st in self._by_slot.values():
            self._flush(st)

    def _seal(self, rid: str) -> None:
        st = self.requests.pop(rid, None)
        self._owner.pop(rid, None)
        self._slot_of.pop(rid, None)
        if st is not None:
            if not st.done:
                self._finish(st, natural=False)    # cancelled, aborted or stopped by a string
            self._flush(st)
            del self._by_slot[st.slot]
            self.slots.give_back(st.slot)
            self._rows_key = None                  # the slot may be taken again

    def _retire(self, live_requests: dict, keep=frozenset()) -> None:
        """Forget requests that left the runner (but those in ``keep``), sealing those not
        sealed yet."""
        gone = self._owner.keys() - live_requests.keys() - keep
        for rid in gone:
            self._seal(rid)
        if gone:
            self._rows_key = None

    def _account(self, reqs: int, proposed: int, accepted: int, any_live: bool) -> None:
        if any_live:
            self.round.steps += 1
        if reqs:
            self.verify_log.append((reqs, proposed, accepted))
            for r in (self.round, self.totals):
                r.verifications += reqs
                r.proposed += proposed
                r.accepted += accepted

    def _maybe_end_round(self) -> None:
        if not self._running:
            self._end_round()

    def _end_round(self) -> None:
        if self.round.n_fwd:
            self.classes.observe_round(self.round.n_fwd)
            self.n_fwd_log.append(self.round.n_fwd)
            self.rounds += 1
        if self.round.steps or self.round.n_fwd:
            self.totals.steps += self.round.steps
            self.round = Round()

    # ------------------------------------------------------------------ reporting
    def sync(self) -> None:
        """Wait for the background feed and seal rollouts that ended since the last step
        (the API calls it between steps)."""
        self.settle()
        if self._runner is not None:
            self._retire(self._runner.requests)
            self._maybe_end_round()

    def stats(self) -> dict:
        self.sync()
        self._flush_all()
        t = self.totals
        cur = self.round
        verifications = t.verifications
        return {
            **self.store.stats(),
            "rounds": self.rounds,
            "steps": t.steps + cur.steps,
            "verifications": verifications,
            "proposed": t.proposed,
            "accepted": t.accepted,
            "acceptance_rate": t.accepted / t.proposed if t.proposed else 0.0,
            "mean_accepted_per_verification": t.accepted / verifications if verifications else 0.0,
            "n_fwd_recent_rounds": list(self.n_fwd_log),   # T_short is their mean
            "phase": dict(self.phase_totals),               # batch_cap="phase" decisions
            "cost_cap": dict(self.cap_totals),              # batch_cap="cost": off steps
            "draft_host_ms": self.draft_host_ms,            # async: a drafting step's path
            "per_step": [list(x) for x in self.verify_log],
        }

    def phase(self) -> list[dict]:
        """The recent phase-aware decisions (:class:`PhaseStep`, oldest first)."""
        return [asdict(x) for x in self.phase_log]

    def prebuild(self, problem_id: str, rollouts, prompt_token_ids=None) -> int:
        self.sync()
        tail = list(prompt_token_ids or [])[-self.cfg.prompt_tail:] if prompt_token_ids else []
        for tokens in rollouts:
            self.store.insert(problem_id, list(tokens), tail)
        return len(rollouts)

    def clear(self, problem_id: str | None = None) -> int:
        self.sync()
        self._flush_all()
        return self.store.clear(problem_id)


def _das_flags(extra_args: dict | None, request_id: str) -> RLFlags | None:
    """A request's flags, read once per request (:func:`vllm_rl.flags.read`: the
    canonical form the front end wrote).  Flags that do not read (the front end was
    bypassed) are logged once for the request, which is served without drafts."""
    return read_or_warn(extra_args, request_id, logger)

def _scheduled_drafts(sched, req_ids, n: int) -> np.ndarray:
    """Synchronous scheduling: per row, the draft tokens the step verified (the
    scheduler's ``scheduled_spec_decode_tokens``, placeholders not counted)."""
    spec = sched.scheduled_spec_decode_tokens if sched is not None else {}
    if not spec:
        return np.zeros(n, dtype=np.int64)
    lists = list(map(spec.get, req_ids, repeat(())))
    lens = np.fromiter(map(len, lists), dtype=np.int64, count=n)
    total = int(lens.sum())
    if not total:
        return lens
    flat = np.fromiter(chain.from_iterable(lists), dtype=np.int64, count=total)
    neg = np.flatnonzero(flat < 0)
    if len(neg):
        ends = np.cumsum(lens)
        lens = lens - np.bincount(np.searchsorted(ends, neg, side="right"), minlength=n)
    return lens


@dataclass
class _InFlight:
    """An async step whose sampled ids are on their way to the host, with its rows as
    the runner had them."""

    sampled: Any                 # host tensor [rows, k + 1]
    event: Any                   # its copy's event (None: already on the host)
    discard: np.ndarray          # rows whose sample is discarded (a prefill chunk)
    req_ids: list = field(default_factory=list)
    owners: list = field(default_factory=list)   # the runner's state of each row
    n_prompt: Any = None         # prompt lengths
    sched: Any = None            # the step's scheduler output (as the worker ran it)
    drafted: Any = None          # draft tokens each row was verified on in the step


@dataclass
class _Ready:
    """Drafts made from an async step, for the step after it (rows: that step's)."""

    rows: dict
    drafts: np.ndarray
    lengths: np.ndarray
    sched: Any


def _to_host(t):
    """Start ``t``'s copy to the host: (host tensor, event to wait on, or None)."""
    import torch

    if t.device.type == "cpu":
        return t, None
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t, non_blocking=True)
    event = torch.cuda.Event()
    event.record()
    return host, event


def _upload(runner, ready: _Ready, k_max: int) -> None:
    """Put the drafts where vLLM's async path scatters them into the step's input ids
    (``_draft_token_ids``, rows of the previous step, ``prev_num_spec_tokens`` wide)."""
    import torch

    n = len(ready.rows)
    drafts = np.zeros((n, k_max), dtype=np.int32)
    w = min(k_max, ready.drafts.shape[1]) if ready.drafts.ndim == 2 else 0
    if w:
        drafts[:, :w] = ready.drafts[:, :w]
    t = torch.from_numpy(drafts)
    if runner.device.type != "cpu":
        t = t.pin_memory().to(runner.device, non_blocking=True)
    runner._draft_token_ids = t
    runner.prev_num_spec_tokens = k_max
    if runner._draft_token_req_ids is not None:      # penalties read the drafts on the host
        runner._copy_draft_token_ids_to_cpu(ready.sched)


def _trimmed(sched, counts: dict, cut: dict):
    """A copy of the scheduler output with each request in ``cut`` scheduled on its
    ``counts`` draft tokens only (the scheduler's own object is left as it scheduled)."""
    import copy

    out = copy.copy(sched)
    spec = dict(sched.scheduled_spec_decode_tokens)
    num = dict(sched.num_scheduled_tokens)
    total = sched.total_num_scheduled_tokens
    for rid, scheduled in cut.items():
        k = counts.get(rid, 0)
        num[rid] -= scheduled - k
        total -= scheduled - k
        if k:
            spec[rid] = spec[rid][:k]
        else:
            del spec[rid]
    out.scheduled_spec_decode_tokens = spec
    out.num_scheduled_tokens = num
    out.total_num_scheduled_tokens = total
    return out


def _contexts(token_ids_cpu) -> np.ndarray:
    """The runner's token array as the batched call reads it (vLLM's is int32 already)."""
    a = np.asarray(token_ids_cpu)
    if a.dtype != np.int32 or a.ndim != 2 or a.strides[1] != 4:
        a = np.ascontiguousarray(a, dtype=np.int32)
    return a
