"""DASProposer: the DAS drafter as vLLM's ``custom_class`` speculative method.

vLLM calls :meth:`DASProposer.propose` after every decode step with the tokens each
running request just got (accepted drafts plus the bonus token); what it returns is
verified by the target model in the next step, by vLLM's own rejection sampler, so
the output distribution is the model's (lossless).  The patch
``patches/model_runner/das_context.py`` hands the proposer the model runner and the step's
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
   (:func:`vllm_rl.das.batch_caps.phase_budgets`, :meth:`DASProposer._phase`) gives each
   request the length that makes the next step cheapest per generated token on the
   engine's step-cost model, from its own acceptance estimate (Eq. 3's k): off or short
   in the bulk of a rollout step, the full budget in its tail; ``"cost"`` one length
   for all (:func:`vllm_rl.das.batch_caps.cost_cap`); ``"linear"`` a fixed scale
   (:func:`vllm_rl.das.batch_caps.batch_cap`).
4. *Draft*: the most frequent continuation of the longest context suffix that the
   tree has seen continued (the rollout itself is in the tree, so its own last
   occurrence never continues: the C++ draft backs off, by bisection, to the longest
   suffix that does).

Host cost.  Steps 1 and 4 for every row are one C++ call without the GIL
(:meth:`vllm_rl.das.store.ProblemTrees.feed_and_draft`): every growing rollout is
extended, then every row drafts from the trees as fed, with its own budget and
``min_prob``.  The per-request state is numpy columns (:class:`.request_columns.Slots`), so the
Python work of a step is a fixed number of array operations plus C-level ``map`` passes
over vLLM's lists (the row -> request lookup, flattening ``sampled_token_ids``).
Python runs per request only where it is amortised: a request's admission, its natural
end (stop token, ``max_tokens``: it is sealed in the store), its length-class check
every :data:`~.draft_lengths.CLASS_CHECK_EVERY` tokens (``policy="class"``), its departure.  Two
settings stay per request per step: ``policy="optimal"`` (Eq. 6-7 fits (k, alpha) and
the expected remaining length per request in Python, ~10-20 µs per optimal request)
and ``batch_cap="phase"`` (the acceptance estimates are one vectorised bisection, but
:func:`vllm_rl.das.batch_caps.phase_budgets` is a heap over the distinct (q, cap) pairs,
~1-3 µs per drafting request).  ``python -m vllm_rl.bench.overhead.das_drafter`` measures it.

The drafter's parts: :mod:`.requests` (admission, each step's counts, natural ends,
sealing, rounds), :mod:`.draft_lengths` (step 3: budgets and the batch cap, one cap chosen at
construction), :mod:`.async_drafts` (vLLM's async scheduling: the drafts of step n + 1
made while step n runs, on a guess of its outcome: nothing on the step's path), their
typed state in :mod:`.state`; the trees are :mod:`.store` over the C++ ``_C``.

Requests without ``das`` flags get no draft and decode as on a stock engine.  A round
(one rollout batch) ends when no DAS request is left; its N_fwd, the most forward
passes any of its requests took (Eq. 4: the passes the batch needs), feeds T_short
(Sec. 4.2.3).  Classes are re-evaluated every
:data:`~.draft_lengths.CLASS_CHECK_EVERY` tokens.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import asdict
from itertools import chain, repeat
from typing import Any

import numpy as np
from vllm.logger import init_logger

from vllm_rl.cost import load_cost
from vllm_rl.cost.host import WORKER as HOST     # the drafter's host time, for the trace
from vllm_rl.das import length_classes
from vllm_rl.das.async_drafts import AsyncDrafts
from vllm_rl.das.draft_lengths import DraftBudgets
from vllm_rl.das.config import DASConfig
from vllm_rl.das.requests import RequestBook
from vllm_rl.das.request_columns import Slots
from vllm_rl.das.state import Round, StepRows
from vllm_rl.das.store import ProblemTrees
from vllm_rl.das.tree import draft_lists

logger = init_logger(__name__)


class DASProposer(AsyncDrafts, DraftBudgets, RequestBook):
    """The ``custom_class`` proposer of a DAS engine (see the module docstring)."""

    def __init__(self, vllm_config: Any) -> None:
        cfg = DASConfig.from_vllm_config(vllm_config)
        if cfg is None:
            raise ValueError("DASProposer needs speculative_config.model = "
                             "'vllm_rl.das.drafter.DASProposer' (use vllm_rl.LLM(das=True))")
        self.cfg = cfg
        self.max_model_len = vllm_config.model_config.max_model_len
        self.k_max = vllm_config.speculative_config.num_speculative_tokens
        self.store = ProblemTrees(cfg.window, cfg.max_stored_tokens, cfg.max_depth, cfg.prior)
        # the windows' dropped rollouts leave their trees on the feeder thread
        self.store.defer_removals = cfg.background_feed
        self.classes = length_classes.LengthClasses(horizon=cfg.round_horizon, history=cfg.history)
        self.slots = Slots()
        self.round = Round()
        self.rounds = 0
        self.verify_log: deque = deque(maxlen=cfg.stats_rounds)  # per step (reqs, prop, acc)
        self.totals = Round()
        self.n_fwd_log: deque = deque(maxlen=cfg.round_horizon)
        self._runner = None
        self._sched = None
        extra = getattr(vllm_config, "additional_config", None) or {}
        self.cost = load_cost(extra.get("vllm_rl_cost"))   # the engine's step-cost model
        self._steps = 0                         # propose() calls
        self._verified = 0                      # draft tokens verified in this step
        self._feeder = None                     # the background feed's thread
        self._pending = None                    # its call in flight (a Future)
        self.host_ns = {"feed": 0, "draft": 0, "feed_background": 0}  # the C++ calls' CPU time
        self._init_requests()
        self._init_budgets()
        self._init_async()

    def load_model(self, *args, **kwargs) -> None:
        """No draft model: the trees are the drafter (and survive weight reloads)."""

    @property
    def _asynchronous(self) -> bool:
        """The runner schedules asynchronously (vLLM's ``use_async_scheduling``)."""
        return bool(getattr(self._runner, "use_async_scheduling", False))

    def bind_step(self, runner: Any, scheduler_output: Any) -> None:
        """Called by ``patches/model_runner/das_context.py`` before each :meth:`propose`."""
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

    def _run(self, req_ids, step: StepRows, drafted: np.ndarray, contexts: np.ndarray,
             context_len: np.ndarray, draft: bool = True):
        """One synchronous step of the drafter over its rows (module docstring, steps
        1-4): the drafts as :class:`~vllm_rl.das.tree.BatchDrafts`."""
        live = self._ingest(step, drafted)
        phase = self._decide(req_ids, step, live, draft)
        return self._draft(step, contexts, context_len, phase)

    def _ingest(self, step: StepRows, drafted: np.ndarray) -> np.ndarray:
        """A step's tokens: Eq. 3's counts of the drafts they verified, each rollout's
        new tokens counted (``step.feed``: fed by the next tree call), natural ends
        sealed, the round accounted.  Returns the rows that go on."""
        S = self.slots
        das = step.slots >= 0
        active = das & ~S.done[step.safe] & (np.diff(step.offsets) > 0)
        step_reqs, step_prop, step_acc = self._verify(step, active, drafted)
        live = self._feed(step, active)
        self._account(step_reqs, step_prop, step_acc, bool(len(live)))
        self._maybe_end_round()
        self._steps += 1
        self._verified = step_prop
        return live

    def _draft(self, step: StepRows, contexts: np.ndarray, context_len: np.ndarray, phase):
        """Synchronous scheduling's one C++ call: every row's counted tokens into its
        tree, then every row with a length drafts from its context.  With
        ``DASConfig.background_feed`` the rows that draft nothing are fed on the feeder
        thread instead, off the step's path."""
        S = self.slots
        seqs = np.where(step.slots >= 0, S.seq[step.safe], -1)
        later = None
        if self.cfg.background_feed:        # rows drafting nothing: fed off the step's path
            later = step.feed * (step.max_tokens <= 0)
            step.feed -= later
        res = self.store.feed_and_draft(
            seqs, step.tokens, step.offsets, step.feed, contexts, context_len,
            step.max_tokens, self._min_prob(step), backoff=True)
        self.host_ns["feed"] += res.feed_ns
        self.host_ns["draft"] += res.draft_ns
        self._feed_in_background([(seqs, step.tokens, step.offsets, later)]
                                 if later is not None and later.any() else [])
        if phase is not None:
            self._phase_cut(phase, res.lengths)
        self._note_width(res.lengths, step.n)
        return res

    def settle(self) -> None:
        """Before anything reads or changes the trees (the ``das_*`` calls): finish an
        async step whose tokens were not fed yet (its drafts wait for the next step),
        wait for the background feed, seal the old requests of reused ids, and take the
        rollouts the windows dropped out of their trees."""
        if self._in_flight:
            self._tree_call(self._catch_up(last=True), None)
            self._last = None               # its drafts wait for the next step
        self._wait_feed()
        self._seal_detached()
        self.store.remove(self.store.take_removals())

    def sync(self) -> None:
        """Wait for the background feed, seal rollouts that ended since the last step
        and take the rollouts the windows dropped out of their trees (the API calls it
        between steps)."""
        self.settle()
        if self._runner is not None:
            self._retire(self._runner.requests)
            self._maybe_end_round()
            self.store.remove(self.store.take_removals())

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
            "cost_cap": dict(self.cap_totals),      # batch_cap="cost"/"confidence": off steps
            "lookahead": dict(self.lookahead_totals),       # async: hypotheses borne out
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

    def _feed_in_background(self, feeds: list[tuple]) -> None:
        """On the feeder thread: feed these rows' new tokens (``(seqs, tokens, offsets,
        feed)`` each), then take the rollouts the windows dropped out of their trees
        (:meth:`~.store.ProblemTrees.take_removals`; the C++ calls release the GIL).
        :meth:`_wait_feed` waits for it before the next draft, so a draft sees the
        same trees run after run."""
        doomed = self.store.take_removals()
        if not feeds and not doomed:
            return
        if self._feeder is None:
            from concurrent.futures import ThreadPoolExecutor

            self._feeder = ThreadPoolExecutor(1, thread_name_prefix="vllm_rl-das-feed")
        calls = [self.store.feed_later(*args) for args in feeds]    # sizes counted here
        self._pending = self._feeder.submit(_background, calls, doomed)

    def _wait_feed(self) -> None:
        """Wait for the feeder thread's last call.  Its feeds' CPU time off the step's
        path is in ``host_ns["feed_background"]``; the time waited here is on it."""
        pending, self._pending = self._pending, None
        if pending is not None:
            self.host_ns["feed_background"] += pending.result()


def _background(calls: list, doomed: list) -> int:
    """The feeder thread's call (:meth:`DASProposer._feed_in_background`): the feeds'
    C++ calls, then the removals, which run even if a feed fails (the windows already
    count them out).  Returns the feeds' CPU time (ns)."""
    try:
        return sum(call().feed_ns for call in calls)
    finally:
        ProblemTrees.remove(doomed)


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


def _contexts(token_ids_cpu) -> np.ndarray:
    """The runner's token array as the batched call reads it (vLLM's is int32 already)."""
    a = np.asarray(token_ids_cpu)
    if a.dtype != np.int32 or a.ndim != 2 or a.strides[1] != 4:
        a = np.ascontiguousarray(a, dtype=np.int32)
    return a


__all__ = ["DASProposer"]
