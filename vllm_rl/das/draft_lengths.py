"""The DAS drafter's draft lengths per step: budgets (Sec. 4.2) times the batch cap.

Each live row gets its policy's budget (``fixed`` 2b, ``class`` 0/b/2b by its length
class, Sec. 4.2.3, ``optimal`` Eq. 6-7), within what it may still verify, and the batch
cap decides how much of it the step drafts (drafting stops paying on a big batch,
Sec. 4.2.1), chosen at construction (``DASConfig.batch_cap``):

* ``cost`` (default): one length for every row, the one that makes the step cheapest
  per generated token on the engine's step-cost model (:func:`.batch_caps.cost_cap`) at the
  engine's recent acceptance; probes every :data:`PROBE_EVERY` steps it has drafting off;
* ``phase``: a length per row from its own acceptance estimate (Eq. 3's k, shrunk toward
  its problem's and the engine's), :func:`.batch_caps.phase_budgets`, cut again to what the
  tree actually drafted;
* ``linear``: full budget up to ``full_batch`` rows, scaled down to none at
  ``off_batch`` (:func:`.batch_caps.batch_cap`);
* ``confidence``: every row drafts its budget, each draft cut where the tree's
  probability that it holds falls below the price of a draft token at this step's batch
  on the step-cost model (:meth:`DraftBudgets._draft_price`): long drafts in the tail,
  only the sure ones in the bulk.
"""
from __future__ import annotations

import time
from collections import deque
from itertools import islice, repeat

import numpy as np

from vllm_rl.cost import OnlineCost
from vllm_rl.das import budget_model as policy
from vllm_rl.das import length_classes
from vllm_rl.das import batch_caps as draft_caps
from vllm_rl.das.request_columns import CLASS, FIXED, OPTIMAL
from vllm_rl.das.state import PhaseStep, RequestState, StepRows

CLASS_CHECK_EVERY = 8    # tokens between length-class updates of a request
# The cost cap reads the acceptance of recent verifications; when it has drafted nothing
# for PROBE_EVERY steps (the trees may have grown since), one step drafts at full length
# for at most PROBE_ROWS requests: fresh evidence at the price of a few wider rows.
PROBE_EVERY = 16
PROBE_ROWS = 8
# Acceptance estimates of the phase-aware cap (Eq. 3's k, das.budget_model.estimate_k): a
# request's own counts shrunk toward its problem's, the problem's toward the engine's
# recent rate, each prior worth PRIOR_DRAFTS draft tokens; a problem's counts decay with
# a horizon of PROBLEM_HORIZON verifications (its tree and the policy move on).
PRIOR_DRAFTS = 16.0
PROBLEM_HORIZON = 256
PHASE_LOG = 256          # recent phase decisions kept for das_phase() (tests, debugging)


def _few(req_ids, want: np.ndarray, live: int) -> frozenset | None:
    """The requests of the rows in ``want`` when they are at most half of the ``live``
    rows (a probe, the phase cap's tail rows): the scheduler gives placeholder drafts to
    those only; None (every DAS sample) otherwise."""
    rows = np.flatnonzero(want)
    if not len(rows) or 2 * len(rows) > live:
        return None
    return frozenset(map(req_ids.__getitem__, rows.tolist()))


class DraftBudgets:
    """Each step's draft lengths (a part of :class:`~.drafter.DASProposer`)."""

    def _init_budgets(self) -> None:
        cfg = self.cfg
        # Only the linear cap does not read the model: fit it online for the others.
        self._online = cfg.batch_cap != "linear" and isinstance(self.cost, OnlineCost)
        self._t_step: float | None = None
        self._batch, self._context = 0, 0.0    # this step's batch and mean context
        self._undrafted = 0                     # steps the cost cap has drafted nothing
        self._acceptance_at = (-1, 0.5)         # (verifications seen, _recent_acceptance)
        # phase cap: per-problem decayed acceptance counts (proposed, accepted, generated),
        # by problem key; a problem keeps its key (and counts) for the drafter's life
        self._problem_keys: dict[str, int] = {}
        self._problem_acc = np.zeros((64, 3))
        self._problem_seen = np.zeros(64, dtype=bool)
        self.phase_log: deque = deque(maxlen=PHASE_LOG)
        self.phase_totals = {"decisions": 0, "drafting": 0, "probes": 0, "drafts": 0}
        self.cap_totals = {"decisions": 0, "off": 0}   # cost cap: steps, steps it said 0
        self._drafting = True                   # the last decision drafted for a row
        self._drafts_for: frozenset | None = None   # ... for these requests only (None: all)
        self._draft_now = True                  # this decision's drafts are used
        # async: the host time a drafting step adds to the path without the lookahead
        # (ms, decayed mean: the drafter after its wait for the last step's ids, then
        # vLLM's input preparation until the forward pass, patches/model_runner/das_async.py; the cost
        # cap counts it against the tokens drafting saves)
        self.draft_host_ms = 0.0
        # the batch cap, chosen once: each writes step.max_tokens for the live rows
        # (the phase cap returns what its cut after the tree call needs)
        self._cap_rows = {"cost": self._cost_rows, "phase": self._phase,
                          "linear": self._linear_rows,
                          "confidence": self._confidence_rows}[cfg.batch_cap]
        self._width = 0.0          # the last drafting step's drafts per row (confidence cap)

    def _decide(self, req_ids, step: StepRows, live: np.ndarray, draft: bool):
        """Each live row's draft length for the next verification (budgets, Sec. 4.2,
        times the batch cap) into ``step.max_tokens``; :attr:`_drafting` says whether
        any row would draft.  Without ``draft`` the lengths are decided (a decision to
        draft holds until a drafting step uses it) and zeroed.  Returns what the phase
        cap's cut needs (None: no cut)."""
        sched = self._sched
        S = self.slots
        self._draft_now = draft
        phase = None
        if len(live):
            if self._online:
                self._observe_step(sched, req_ids, step.ntok)
            self._batch = len(req_ids)
            self._context = float(step.ntok.sum()) / max(self._batch, 1)
            forced = live[S.force[step.slots[live]]] if self._forcing else live[:0]
            if len(forced):                       # das.force: past the batch cap
                live = live[~S.force[step.slots[live]]]
            if len(live):
                phase = self._cap_rows(live, step)
            if len(forced):
                step.max_tokens[forced] = self._room(forced, step,
                                                     self._budgets(forced, step, 1.0))
        want = step.max_tokens > 0
        # whether the next async step waits to draft: not while live rows all got 0; a
        # decision to draft made while only feeding holds until a drafting step uses it
        decided = bool(want.any()) if len(live) else True
        rows = _few(req_ids, want, len(live)) if decided and len(live) else None
        if draft or not self._drafting:
            self._drafts_for = rows
        elif decided and self._drafts_for is not None:   # held decisions: their rows' union
            self._drafts_for = None if rows is None else self._drafts_for | rows
        self._drafting = decided if draft else (self._drafting or decided)
        if not draft:
            step.max_tokens[:] = 0
            phase = None
        return phase

    def _room(self, rows: np.ndarray, step: StepRows, budgets: np.ndarray) -> np.ndarray:
        """``budgets`` within what each row's request may still verify (the model length,
        its max_tokens; one token of each step is the sampled one)."""
        S = self.slots
        s = step.slots[rows]
        ahead = step.ahead[rows] if isinstance(step.ahead, np.ndarray) else step.ahead
        room = np.minimum(self.max_model_len - step.ntok[rows] - 1,
                          S.max_tokens[s] - S.generated[s] - ahead - 1)
        return np.maximum(0, np.minimum(budgets, room))

    def _budgets(self, rows: np.ndarray, step: StepRows, cap: float) -> np.ndarray:
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
            S.rank[i] = length_classes.CLASSES.index(new)
            S.class_budget[i] = self.classes.budget(new, st.budget)

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

    def _cost_rows(self, live: np.ndarray, step: StepRows) -> None:
        """The cost cap (:meth:`_cost_cap`): ``step.max_tokens`` for the rows that draft,
        one length for all; a probe of :data:`PROBE_ROWS` rows every
        :data:`PROBE_EVERY` steps it has drafting off."""
        k_cap = self._cost_cap(step.n, len(live))
        self.cap_totals["decisions"] += 1
        self.cap_totals["off"] += k_cap == 0
        if k_cap == 0:
            self._undrafted += 1
            if self._undrafted < PROBE_EVERY:
                return
            k_cap = self.k_max                   # fresh acceptance evidence
            if self._draft_now:                  # (a probe only counts if drafted)
                self._undrafted = 0
            live = live[:PROBE_ROWS]
        else:
            self._undrafted = 0
        budgets = np.minimum(self._budgets(live, step, 1.0), k_cap)
        step.max_tokens[live] = self._room(live, step, budgets)

    def _confidence_rows(self, live: np.ndarray, step: StepRows) -> None:
        """The confidence cap: every live row drafts its budget, and each draft stops
        where the tree's cumulative probability of its tokens (Sec. 4.1's count ratios,
        the chance that the draft holds that far) falls below the price of one more
        draft token at this step (:meth:`_draft_price`), or below the row's own
        ``min_prob``.  A draft token pays where its acceptance beats its price, so on a
        wide batch only the drafts the tree is sure of are verified."""
        tau = self._draft_price(step.n)
        self.cap_totals["decisions"] += 1
        if tau >= 1.0:                          # no draft can pay
            self.cap_totals["off"] += 1
            return
        step.max_tokens[live] = self._room(live, step, self._budgets(live, step, 1.0))
        step.min_prob = self.slots.min_prob[step.safe]          # a copy: rows not capped
        step.min_prob[live] = np.maximum(step.min_prob[live], tau)   # keep their own

    def _draft_price(self, batch: int) -> float:
        """τ = (t(w + 1) − t(w)) / t(0): the acceptance at which one more draft token
        pays, in a step of ``batch`` rows that verify w drafts each (t: the step-cost
        model's time at this batch and mean context by drafts per row, Eq. 1 measured;
        w: the last drafting step's mean, floored).  The token costs
        (t(w + 1) − t(w)) / B and yields its acceptance p in tokens, against t(0) / B per
        token of a step without drafts: it lowers the step's time per token when
        p > τ (up to drafting's own gain, which the bound leaves out).  The forward pass
        only: with ``lookahead=False`` the wait a drafting step adds to the path is not
        priced here (the cost cap prices it)."""
        k = min(int(self._width), max(self.k_max - 1, 0))
        t0, tw, tw1 = self.cost.width_curve(batch, [1.0, 1.0 + k, 2.0 + k], self._context)
        return max(tw1 - tw, 0.0) / t0 if t0 > 0 else 0.0

    def _note_width(self, lengths: np.ndarray, rows: int) -> None:
        """The drafts per row this step verifies (the confidence cap's w)."""
        self._width = float(lengths.sum()) / rows if rows else 0.0

    def _min_prob(self, step: StepRows) -> np.ndarray:
        """Each row's cumulative-probability cutoff this step (the cap's, else its own)."""
        return self.slots.min_prob[step.safe] if step.min_prob is None else step.min_prob

    def _linear_rows(self, live: np.ndarray, step: StepRows) -> None:
        """The linear cap (:func:`.batch_caps.batch_cap`): the budgets scaled by batch size."""
        cap = draft_caps.batch_cap(step.n, self.cfg.full_batch, self.cfg.off_batch)
        if cap > 0.0:
            step.max_tokens[live] = self._room(live, step, self._budgets(live, step, cap))

    def _cost_cap(self, batch: int, drafting: int) -> int:
        """Sec. 4.2.1's batch cap from the step-cost model: the draft length that makes
        this step cheapest per generated token (:func:`.batch_caps.cost_cap`), host time
        counted: under async scheduling a drafting step also pays :attr:`draft_host_ms`
        (the drafter's time after the forward pass, measured), which a step without
        drafts hides under the forward pass."""
        q = self._recent_acceptance()
        host = self.draft_host_ms if self._asynchronous and not self.cfg.lookahead else 0.0
        curve = self.cost.width_curve(
            batch, [1.0 + k * drafting / batch for k in range(self.k_max + 1)], self._context)
        if host:
            curve[1:] = [v + host for v in curve[1:]]
        return draft_caps.cost_cap(curve.__getitem__, batch, drafting, q, self.k_max)

    def _recent_acceptance(self) -> float:
        """The engine's per-draft-token acceptance over its last 64 verification steps
        (:func:`policy.chain_acceptance`), clamped to [0.05, 0.95]; 0.5 before any."""
        seen = self.totals.verifications        # grows with every verify_log entry
        if self._acceptance_at[0] == seen:       # no verification since: the same rate
            return self._acceptance_at[1]
        recent = list(islice(reversed(self.verify_log), 64))
        prop = sum(x[1] for x in recent)
        acc = sum(x[2] for x in recent)
        q = policy.chain_acceptance(prop, acc, acc + sum(x[0] for x in recent))
        q = 0.5 if q is None else min(max(q, 0.05), 0.95)
        self._acceptance_at = (seen, q)
        return q

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

    def _phase(self, live: np.ndarray, step: StepRows):
        """Phase-aware drafting (:func:`.batch_caps.phase_budgets`): the draft length per request
        that makes the next step cheapest per generated token on the step-cost model, at
        this step's batch and mean context, from each request's acceptance estimate
        (Eq. 3's k) and within its policy's budget (fixed 2b, class 0/b/2b, Eq. 7).

        First with the budgets as caps (if nothing pays, nothing is drafted: the tree is
        not even asked); then the tree drafts the requests that got a length, and
        :meth:`_phase_cut` runs the rule again with what the tree actually had (a draft
        can stop early: no match, or the cumulative-probability cutoff) and cuts the
        drafts to it.  Returns what the cut needs (None: no draft this step)."""
        batch, context = self._batch, self._context
        curve = self.cost.width_curve(batch, [1 + k for k in range(self.k_max + 1)], context)
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


__all__ = ["CLASS_CHECK_EVERY", "DraftBudgets", "PROBE_EVERY", "PROBE_ROWS"]
