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
   suffix that does), for all requests in one call without the GIL.

Requests without ``das`` flags get no draft and decode as on a stock engine.  A round
(one rollout batch) ends when no DAS request is left; its N_fwd, the most forward
passes any of its requests took (Eq. 4: the passes the batch needs), feeds T_short
(Sec. 4.2.3).  Classes are re-evaluated every :data:`CLASS_CHECK_EVERY` tokens.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import asdict, dataclass, field
from itertools import islice
from typing import Any

import numpy as np
from vllm.logger import init_logger

from vllm_rl.das import budget as policy
from vllm_rl.das import caps as draft_caps
from vllm_rl.cost import OnlineCost, load_cost
from vllm_rl.cost.host import WORKER as HOST     # the drafter's host time, for the trace
from vllm_rl.flags import DasFlags, read_or_warn
from vllm_rl.das.config import DASConfig, prompt_problem_id
from vllm_rl.das.store import ProblemTrees
from vllm_rl.das.tree import draft_many

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


@dataclass
class RequestState:
    """One DAS request as the drafter tracks it."""

    problem: str
    seq: int
    flags: DasFlags
    max_tokens: int
    budget: int                         # b for this request
    min_prob: float
    init_class: str = policy.MEDIUM
    length_class: str = policy.MEDIUM
    class_budget: int = 0               # the draft budget of length_class
    next_check: int = 0                 # generated tokens at the next class update
    generated: int = 0                  # output tokens fed so far
    steps: int = 0                      # forward passes that gave it tokens
    stop_ids: frozenset = frozenset()   # token ids that end it (EOS and stop tokens)
    budget_policy: str = "fixed"        # the budget policy (flags, else the engine's)
    done: bool = False                  # sealed: a natural end was seen
    # its drafts: proposed, accepted, generated (Eq. 3's counts; optimal and phase read it)
    est: policy.AcceptanceEstimate = field(default_factory=policy.AcceptanceEstimate)


@dataclass
class DecayedCounts:
    """A problem's acceptance counts, each step's weight decaying by 1 − 1/horizon (the
    fields :func:`vllm_rl.das.budget.estimate_k` reads)."""

    proposed: float = 0.0
    accepted: float = 0.0
    generated: float = 0.0

    def observe(self, proposed: int, accepted: int, generated: int, keep: float) -> None:
        self.proposed = self.proposed * keep + proposed
        self.accepted = self.accepted * keep + accepted
        self.generated = self.generated * keep + generated


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
        self._problem_acc: dict[str, DecayedCounts] = {}    # phase cap: per-problem counts
        self._steps = 0                         # propose() calls
        self._verified = 0                      # draft tokens verified in this step
        self.phase_log: deque = deque(maxlen=PHASE_LOG)
        self.phase_totals = {"decisions": 0, "drafting": 0, "probes": 0, "drafts": 0}

    # ------------------------------------------------------------------ vLLM hooks
    def load_model(self, *args, **kwargs) -> None:
        """No draft model: the trees are the drafter (and survive weight reloads)."""

    def bind_step(self, runner: Any, scheduler_output: Any) -> None:
        """Called by ``patches/das_proposer_context.py`` before each :meth:`propose`."""
        self._runner, self._sched = runner, scheduler_output

    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu,
                slot_mappings=None) -> list[list[int]]:
        """vLLM's ``custom_class`` hook: each row's drafts.  Its host time goes to the
        step trace (:data:`vllm_rl.cost.host.WORKER`)."""
        t0 = time.perf_counter_ns()
        try:
            return self._propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu)
        finally:
            HOST.drafter_ns += time.perf_counter_ns() - t0

    def _propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu) -> list[list[int]]:
        runner, sched = self._runner, self._sched
        if runner is None:
            raise RuntimeError("DASProposer.propose called without bind_step: the "
                               "vllm_rl das_proposer_context patch is not applied")
        batch = runner.input_batch
        req_ids = batch.req_ids
        self._retire(runner.requests)
        drafts: list[list[int]] = [[] for _ in sampled_token_ids]
        spec = sched.scheduled_spec_decode_tokens if sched is not None else {}
        live: list[tuple[int, RequestState]] = []
        step_reqs = step_prop = step_acc = 0
        for i, sampled in enumerate(sampled_token_ids):
            rid = req_ids[i]
            st = self._state(rid, runner, batch, i)
            if st is None or st.done or not sampled:
                continue
            drafted = sum(1 for t in spec.get(rid, ()) if t >= 0)
            if drafted:
                acc = len(sampled) - 1
                st.est.observe(drafted, acc, len(sampled))    # Eq. 3's online estimate
                p = self.store.problems.get(st.problem)
                if p is not None:
                    p.drafted += drafted
                    p.accepted += acc
                if self.cfg.batch_cap == "phase":
                    self._problem_acc.setdefault(st.problem, DecayedCounts()).observe(
                        drafted, acc, len(sampled), 1.0 - 1.0 / PROBLEM_HORIZON)
                step_reqs, step_prop, step_acc = step_reqs + 1, step_prop + drafted, step_acc + acc
            if self._feed(st, sampled, int(num_tokens_no_spec[i])):
                live.append((i, st))
        self._account(step_reqs, step_prop, step_acc, bool(live))
        self._maybe_end_round()
        self._steps += 1
        self._verified = step_prop
        if not live:
            return drafts
        if self._online:
            self._observe_step(sched, req_ids, num_tokens_no_spec)
        self._batch = len(req_ids)
        self._context = float(np.sum(num_tokens_no_spec[:self._batch])) / max(self._batch, 1)
        if self.cfg.batch_cap == "phase":
            self._phase(live, num_tokens_no_spec, token_ids_cpu, drafts)
            return drafts
        if self.cfg.batch_cap == "cost":
            cap, k_cap = 1.0, self._cost_cap(len(req_ids), len(live))
            if k_cap == 0:
                self._undrafted += 1
                if self._undrafted >= PROBE_EVERY:       # fresh acceptance evidence
                    self._undrafted, k_cap = 0, self.k_max
                    live = live[:PROBE_ROWS]
            else:
                self._undrafted = 0
        else:
            cap = draft_caps.batch_cap(len(req_ids), self.cfg.full_batch, self.cfg.off_batch)
            k_cap = self.k_max
        if cap <= 0.0 or k_cap <= 0:
            return drafts
        budgets = [min(b, k_cap) for b in self._budgets(live, cap)]
        self._draft(live, budgets, num_tokens_no_spec, token_ids_cpu, drafts)
        return drafts

    # ------------------------------------------------------------------ step cost
    def _observe_step(self, sched, req_ids, num_tokens_no_spec) -> None:
        """Feed the online cost model the step that just ran (time since the last one)."""
        now = time.perf_counter()
        last, self._t_step = self._t_step, now
        sched_tokens = getattr(sched, "num_scheduled_tokens", None) or {}
        if last is None or not sched_tokens or now - last > 1.0:   # idle gap: no sample
            return
        widths = [int(sched_tokens.get(r, 0)) for r in req_ids]
        contexts = [max(0, int(num_tokens_no_spec[i]) - w) for i, w in enumerate(widths)]
        self.cost.observe(widths, contexts, (now - last) * 1e3)

    def _cost_cap(self, batch: int, drafting: int) -> int:
        """Sec. 4.2.1's batch cap from the step-cost model: the draft length that makes
        this step cheapest per generated token (:func:`.caps.cost_cap`)."""
        q = self._recent_acceptance()
        width = lambda k: 1.0 + k * drafting / batch   # noqa: E731
        return draft_caps.cost_cap(lambda k: self.cost.uniform_ms(batch, width(k), self._context),
                               batch, drafting, q, self.k_max)

    def _recent_acceptance(self) -> float:
        """The engine's per-draft-token acceptance over its last 64 verification steps
        (:func:`policy.chain_acceptance`), clamped to [0.05, 0.95]; 0.5 before any."""
        recent = list(islice(reversed(self.verify_log), 64))
        prop = sum(x[1] for x in recent)
        acc = sum(x[2] for x in recent)
        q = policy.chain_acceptance(prop, acc, acc + sum(x[0] for x in recent))
        return 0.5 if q is None else min(max(q, 0.05), 0.95)

    def _acceptance(self, live: list[tuple[int, RequestState]]) -> list[float]:
        """Eq. 3's k per request (:func:`policy.estimate_k`): its own drafts' counts,
        shrunk toward its problem's (decayed) counts, shrunk toward the engine's recent
        rate."""
        q_engine = self._recent_acceptance()
        by_problem: dict[str, float] = {}
        out = []
        for _, st in live:
            q_p = by_problem.get(st.problem)
            if q_p is None:
                counts = self._problem_acc.get(st.problem)
                q_p = q_engine if counts is None else policy.estimate_k(
                    counts, q_engine, PRIOR_DRAFTS)
                by_problem[st.problem] = q_p
            out.append(policy.estimate_k(st.est, q_p, PRIOR_DRAFTS) if st.est.proposed
                       else q_p)
        return out

    def _phase(self, live, num_tokens_no_spec, token_ids_cpu, drafts) -> None:
        """Phase-aware drafting (:func:`.caps.phase_budgets`): the draft length per request
        that makes the next step cheapest per generated token on the step-cost model, at
        this step's batch and mean context, from each request's acceptance estimate
        (Eq. 3's k) and within its policy's budget (fixed 2b, class 0/b/2b, Eq. 7).

        First with the budgets as caps (if nothing pays, nothing is drafted: the tree is
        not even asked); then the tree drafts the requests that got a length, and the
        rule runs again with what the tree actually had (a draft can stop early: no
        match, or the cumulative-probability cutoff) and the drafts are cut to it."""
        batch, context = self._batch, self._context
        curve = [self.cost.uniform_ms(batch, 1 + k, context) for k in range(self.k_max + 1)]
        step_ms = curve.__getitem__
        caps = [self._room(st, b, int(num_tokens_no_spec[i]))
                for (i, st), b in zip(live, self._budgets(live, 1.0))]
        q = self._acceptance(live)
        ks = draft_caps.phase_budgets(step_ms, batch, q, caps)
        probe = False
        if not any(ks):
            self._undrafted += 1
            if self._undrafted < PROBE_EVERY:
                self._log_phase(batch, context, q, caps, ks, False)
                return
            # fresh acceptance evidence: the requests with the fewest drafts so far
            self._undrafted, probe = 0, True
            order = sorted(range(len(live)), key=lambda j: live[j][1].est.proposed)
            ks = [0] * len(live)
            for j in order[:PROBE_ROWS]:
                ks[j] = caps[j]
        else:
            self._undrafted = 0
        rows = [j for j, k in enumerate(ks) if k > 0]
        self._draft([live[j] for j in rows], [caps[j] for j in rows], num_tokens_no_spec,
                    token_ids_cpu, drafts)
        got = [len(drafts[live[j][0]]) for j in rows]
        if not probe:
            ks = draft_caps.phase_budgets(step_ms, batch, [q[j] for j in rows], got)
            for j, k in zip(rows, ks):
                i = live[j][0]
                drafts[i] = drafts[i][:k]
            q = [q[j] for j in rows]
            self._log_phase(batch, context, q, got, ks, False)
        else:
            self._log_phase(batch, context, [q[j] for j in rows], got, got, True)

    def _room(self, st: RequestState, budget: int, n: int) -> int:
        """``budget`` within what a request with ``n`` tokens may still verify (the model
        length, its max_tokens; one token of each step is the sampled one)."""
        return max(0, min(budget, self.max_model_len - n - 1, st.max_tokens - st.generated - 1))

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
    def _state(self, rid: str, runner: Any, batch: Any, i: int) -> RequestState | None:
        cached = runner.requests.get(rid)
        if rid in self.requests:
            if self._owner.get(rid) is cached:
                return self.requests[rid]
            self._seal(rid)                      # the id was reused by a new request
        st = None
        params = getattr(cached, "sampling_params", None)
        flags = _das_flags(getattr(params, "extra_args", None), rid)
        if flags is not None:
            st = self._start(flags, params, cached, batch, i)
        self.requests[rid] = st
        self._owner[rid] = cached
        return st

    def _start(self, flags: DasFlags, params, cached, batch, i) -> RequestState:
        n_prompt = int(batch.num_prompt_tokens[i])
        prompt = cached.prompt_token_ids or []
        problem = flags.problem_id or prompt_problem_id(prompt)
        tail = list(prompt[max(0, n_prompt - self.cfg.prompt_tail):n_prompt])
        seq = self.store.start(problem, tail)
        max_tokens = params.max_tokens or (self.max_model_len - n_prompt)
        b = self.cfg.budget if flags.budget is None else min(flags.budget, self.cfg.budget)
        init = self.classes.initial(self.store.lengths(problem), max_tokens)
        stop_ids = set(params.all_stop_token_ids or ())
        if params.eos_token_id is not None and not params.ignore_eos:
            stop_ids.add(params.eos_token_id)
        return RequestState(
            problem=problem, seq=seq, flags=flags, max_tokens=max_tokens, budget=b,
            min_prob=self.cfg.min_prob if flags.min_prob is None else flags.min_prob,
            init_class=init, length_class=init, class_budget=self.classes.budget(init, b),
            stop_ids=frozenset(stop_ids), budget_policy=flags.policy or self.cfg.policy)

    def _feed(self, st: RequestState, sampled: list[int], num_tokens: int) -> bool:
        """Extend the rollout with this step's tokens; seal it at a natural end (the
        tokens after a stop token are not the sample's).  True if it goes on."""
        end = next((j + 1 for j, t in enumerate(sampled) if t in st.stop_ids), None)
        tokens = sampled if end is None else sampled[:end]
        self.store.extend(st.problem, st.seq, tokens)
        st.generated += len(tokens)
        st.steps += 1
        if end is None and st.generated < st.max_tokens and num_tokens < self.max_model_len:
            return True
        st.done = True
        self._finish(st, natural=True)
        return False

    def _finish(self, st: RequestState, natural: bool) -> None:
        self.store.finish(st.problem, st.seq, st.generated, natural)
        if natural:
            self.classes.observe_final(st.init_class, st.generated, st.max_tokens)
        self.round.n_fwd = max(self.round.n_fwd, st.steps)

    def _seal(self, rid: str) -> None:
        st = self.requests.pop(rid, None)
        self._owner.pop(rid, None)
        if st is not None and not st.done:
            self._finish(st, natural=False)        # cancelled, aborted or stopped by a string

    def _retire(self, live_requests: dict) -> None:
        """Forget requests that left the runner, sealing those not sealed yet."""
        for rid in [r for r in self.requests if r not in live_requests]:
            self._seal(rid)

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
        if not any(s is not None and not s.done for s in self.requests.values()):
            self._end_round()

    def _end_round(self) -> None:
        if self.round.n_fwd:
            self.classes.observe_round(self.round.n_fwd)
            self.n_fwd_log.append(self.round.n_fwd)
            self.rounds += 1
        if self.round.steps or self.round.n_fwd:
            self.totals.steps += self.round.steps
            self.round = Round()

    # ------------------------------------------------------------------ budgets
    def _budgets(self, live: list[tuple[int, RequestState]], cap: float) -> list[int]:
        out = [0] * len(live)
        optimal = [j for j, (_, st) in enumerate(live) if st.budget_policy == "optimal"]
        for j, (_, st) in enumerate(live):
            if st.budget_policy == "fixed":
                out[j] = 2 * st.budget
            elif st.budget_policy == "class":
                if st.generated >= st.next_check and st.length_class != policy.LONG:
                    st.next_check = st.generated + CLASS_CHECK_EVERY
                    new = self.classes.update(st.length_class, st.generated, st.init_class,
                                              st.max_tokens)
                    if new != st.length_class:
                        st.length_class = new
                        st.class_budget = self.classes.budget(new, st.budget)
                out[j] = st.class_budget
        if optimal:
            self._optimal(live, optimal, out)
        return [min(self.k_max, int(b * cap + 0.5)) for b in out]

    def _optimal(self, live, idx: list[int], out: list[int]) -> None:
        """Eq. 6-7 over the running ``optimal`` requests: l_i = expected remaining length
        (the problem's window, conditioned on the length so far), (k_i, alpha_i) fitted
        online to Eq. 3 from the request's own drafts."""
        ls, ks, alphas = [], [], []
        for j in idx:
            st = live[j][1]
            ls.append(max(1.0, self._expected_remaining(st)))
            k, a = policy.estimate_k_alpha(st.est)
            ks.append(k)
            alphas.append(a)
        c_base, c_tok = self._eq1_costs(self._batch)
        n_fwd, totals = policy.optimal_budgets(ls, ks, alphas, c_base, c_tok)
        for j, p in zip(idx, totals):
            out[j] = policy.step_budget(p, max(n_fwd, 1.0), 2 * live[j][1].budget)

    def _eq1_costs(self, batch: int) -> tuple[float, float]:
        """Eq. 1's (c_base, c_tok) for Eq. 7: the cost model linearised at this step's
        batch (:meth:`StepCost.linear_at`), or the configured constants while an online
        model has not been fitted yet."""
        if isinstance(self.cost, OnlineCost) and not self.cost.fitted and self.cost.prior is None:
            return self.cfg.c_base_ms, self.cfg.c_tok_ms
        return self.cost.linear_at(batch, self._context)

    def _expected_remaining(self, st: RequestState) -> float:
        longer = [n for n in self.store.lengths(st.problem) if n > st.generated]
        if longer:
            return sum(longer) / len(longer) - st.generated
        return (self.classes.t_med(st.max_tokens) if st.generated < self.classes.t_med(
            st.max_tokens) else st.max_tokens) - st.generated

    # ------------------------------------------------------------------ drafting
    def _draft(self, live, budgets, num_tokens_no_spec, token_ids_cpu, drafts) -> None:
        depth = self.cfg.max_depth
        todo = []
        for (i, st), b in zip(live, budgets):
            n = int(num_tokens_no_spec[i])
            b = self._room(st, b, n)
            if b <= 0:
                continue
            tree = self.store.problems.get(st.problem)
            if tree is None:
                continue
            todo.append((i, st, tree.tree, token_ids_cpu[i, max(0, n - depth):n].tolist(), b))
        if not todo:
            return
        by_prob: dict[float, list] = {}
        for item in todo:
            by_prob.setdefault(item[1].min_prob, []).append(item)
        for min_prob, items in by_prob.items():
            got = draft_many([t[2] for t in items], [t[3] for t in items],
                             [t[4] for t in items], min_prob, backoff=True)
            for (i, *_), d in zip(items, got):
                drafts[i] = d

    # ------------------------------------------------------------------ reporting
    def sync(self) -> None:
        """Seal rollouts that ended since the last step (the API calls it between steps)."""
        if self._runner is not None:
            self._retire(self._runner.requests)
            self._maybe_end_round()

    def stats(self) -> dict:
        self.sync()
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
        return self.store.clear(problem_id)


def _das_flags(extra_args: dict | None, request_id: str) -> DasFlags | None:
    """A request's DAS flags, read once per request (:func:`vllm_rl.flags.read`: the
    canonical form the front end wrote).  Flags that do not read (the front end was
    bypassed) are logged once for the request, which is served without drafts."""
    flags = read_or_warn(extra_args, request_id, logger)
    return None if flags is None else flags.das