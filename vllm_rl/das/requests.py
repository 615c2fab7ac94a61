"""The DAS drafter's requests: admission, each step's counts, natural ends, sealing.

A request is admitted the first time the drafter sees it in the runner (its flags read
once, :func:`vllm_rl.flags.read_or_warn`; a reused request id is a new rollout), takes a
row of :class:`~.slots.Slots` and starts a rollout in its problem's tree
(:mod:`.store`).  Per step, over the step's rows as arrays (:class:`~.state.StepRows`):
Eq. 3's counts of the drafts each row was verified on (:meth:`RequestBook._verify`),
its new tokens counted for the step's tree call and its natural end found (a stop
token, ``max_tokens``, the model length: sealed at once, :meth:`RequestBook._feed`).
A request that leaves the runner is sealed into its problem's window
(:meth:`RequestBook._retire`).  A round (one rollout batch) ends when no DAS request is
left; its N_fwd, the most forward passes any of its requests took (Eq. 4), feeds
T_short (Sec. 4.2.3).

Python runs per request only at its admission, its natural end and its departure; the
rest is array operations over the step's rows.  The admissions of one step share their
reads (:class:`_Admissions`): a group's flags are read once per ``extra_args`` object and
its problem's initial class (Init_r, Sec. 4.2.3) once per (problem, ``max_tokens``).
"""
from __future__ import annotations

import operator
from collections import Counter
from itertools import repeat
from typing import Any

import numpy as np
from vllm.logger import init_logger

from vllm_rl.das import budget as policy
from vllm_rl.das.config import default_problem_id
from vllm_rl.das.slots import POLICY_CODES, FIXED
from vllm_rl.das.state import RequestState, Round, StepRows
from vllm_rl.flags import DasFlags, RLFlags, read_or_warn

logger = init_logger(__name__)


class RequestBook:
    """The drafter's requests and rounds (a part of :class:`~.drafter.DASProposer`)."""

    def _init_requests(self) -> None:
        self.requests: dict[str, RequestState | None] = {}   # None: not a DAS request
        self._owner: dict[str, Any] = {}    # request id -> the runner's state it was seen with
        self._slot_of: dict[str, int] = {}  # request id -> its slot (DAS requests)
        self._by_slot: dict[int, RequestState] = {}
        self._running = 0                   # DAS requests not sealed yet
        self._stops: Counter = Counter()    # stop ids of the running requests
        self._stop_ids = np.zeros(0, dtype=np.int32)
        self._rows_key: tuple | None = None  # (req_ids, owners) the cached row slots are for
        self._row_slots = np.zeros(0, dtype=np.int64)
        self._forcing = False               # a request with das.force was seen
        self._detached: list[RequestState] = []   # reused ids' old requests, to seal once fed

    def _rows(self, owners, batch, req_ids, tokens, offsets, ntok, memo=None) -> StepRows:
        """The step's rows as arrays (row ``i``, request ``req_ids[i]`` with the runner's
        state ``owners[i]``, got ``tokens[offsets[i]:offsets[i+1]]``); admits the
        requests seen for the first time (and a new request under a reused id).  C-level
        passes over vLLM's lists only: a request's own Python runs at its admission.

        ``memo`` (an async step's :class:`~.async_drafts._InFlight`, mapped twice: its
        drafts planned, then its tokens taken in) keeps the rows' slots with their
        epochs; the second mapping reuses them while no slot of theirs changed hands."""
        S = self.slots
        if memo is not None and memo.row_slots is not None:
            slots = memo.row_slots
            if np.array_equal(S.epoch[np.maximum(slots, 0)], memo.row_epochs):
                return self._step_rows(slots, req_ids, tokens, offsets, ntok)
        n = len(req_ids)
        key = self._rows_key
        if (key is None or key[0] != req_ids or len(key[1]) != n
                or not all(map(operator.is_, owners, key[1]))):
            known = np.fromiter(map(operator.is_, owners, map(self._owner.get, req_ids)),
                                dtype=bool, count=n)
            admissions = _Admissions()
            for i in np.flatnonzero(~known).tolist():
                self._state(req_ids[i], owners[i], batch, i, admissions)
            self._row_slots = np.fromiter(map(self._slot_of.get, req_ids, repeat(-1)),
                                          dtype=np.int64, count=n)
            self._rows_key = (list(req_ids), owners)
        slots = self._row_slots
        if memo is not None:
            memo.row_slots, memo.row_epochs = slots, S.epoch[np.maximum(slots, 0)]
        return self._step_rows(slots, req_ids, tokens, offsets, ntok)

    @staticmethod
    def _step_rows(slots, req_ids, tokens, offsets, ntok) -> StepRows:
        n = len(slots)
        return StepRows(n=n, slots=slots, safe=np.maximum(slots, 0), tokens=tokens,
                        offsets=offsets, feed=np.zeros(n, dtype=np.int32), ntok=ntok,
                        max_tokens=np.zeros(n, dtype=np.int32), req_ids=req_ids)

    def _verify(self, step: StepRows, active, drafted: np.ndarray) -> tuple[int, int, int]:
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

    def _feed(self, step: StepRows, active) -> np.ndarray:
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

    def _state(self, rid: str, cached: Any, batch: Any, i: int,
               memo: "_Admissions | None" = None) -> None:
        """A request seen for the first time (or a new request under a reused id)."""
        memo = memo if memo is not None else _Admissions()
        if rid in self.requests:                 # the id was reused by a new request
            if self._asynchronous:
                self._detach(rid)
            else:
                self._seal(rid)
                memo.initial.clear()             # its seal may slide its problem's window
        st = None
        params = getattr(cached, "sampling_params", None)
        flags = memo.flags(getattr(params, "extra_args", None), rid)
        if flags is not None and flags.das is not None:
            prior = flags.partial.prior_tokens if flags.partial is not None else 0
            st = self._start(flags.das, params, cached, batch, i, prior, memo)
            if flags.arrol is not None and self._asynchronous:
                self.slots.hold[st.slot] = flags.arrol.l_detect
            self._slot_of[rid] = st.slot
            self._by_slot[st.slot] = st
        self.requests[rid] = st
        self._owner[rid] = cached

    def _start(self, flags: DasFlags, params, cached, batch, i, prior: int,
               memo: "_Admissions") -> RequestState:
        """A new rollout.  A continuation (partial rollouts) ends its prompt with its
        ``prior`` tokens from earlier steps: its rollout in the tree, its length and its
        length class are the whole sample's."""
        prompt = cached.prompt_token_ids or []
        n_prompt = len(prompt) if prompt or batch is None else int(batch.num_prompt_tokens[i])
        n_original = n_prompt - prior
        problem = flags.problem_id or default_problem_id(None, prompt[:n_original])
        tail = list(prompt[max(0, n_original - self.cfg.prompt_tail):n_original])
        seq = self.store.start(problem, tail)
        if prior:
            self.store.extend(problem, seq, list(prompt[n_original:n_prompt]))
        max_tokens = prior + (params.max_tokens or (self.max_model_len - n_prompt))
        b = self.cfg.budget if flags.budget is None else min(flags.budget, self.cfg.budget)
        key = (problem, max_tokens)
        init = memo.initial.get(key)
        if init is None:
            init = memo.initial[key] = self.classes.initial(self.store.lengths(problem),
                                                            max_tokens)
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
        S.generated[slot] = prior
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
        if len(self._stops) != before:          # the set changed (sign is one way)
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
            self._seal_state(st)

    def _seal_state(self, st: RequestState) -> None:
        if not st.done:
            self._finish(st, natural=False)        # cancelled, aborted or stopped by a string
        self._flush(st)
        del self._by_slot[st.slot]
        self.slots.give_back(st.slot)
        self._rows_key = None                      # the slot may be taken again

    def _detach(self, rid: str) -> None:
        """Async scheduling: a reused request id names the new request from now on; the
        old one keeps its slot until its last steps are fed (the steps taken in but not
        fed yet still count tokens for it), then :meth:`_seal_detached` seals it."""
        st = self.requests.pop(rid, None)
        self._owner.pop(rid, None)
        self._slot_of.pop(rid, None)
        if st is not None:
            self._detached.append(st)
        self._rows_key = None

    def _seal_detached(self) -> None:
        """Seal the requests :meth:`_detach` kept (their steps were fed since)."""
        detached, self._detached = self._detached, []
        for st in detached:
            self._seal_state(st)

    def _retire(self, live_requests: dict, held=None) -> None:
        """Forget requests that left the runner (but those for which ``held(rid)`` is
        true), sealing those not sealed yet."""
        gone = self._owner.keys() - live_requests.keys()
        if gone and held is not None:
            gone = [rid for rid in gone if not held(rid)]
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


class _Admissions:
    """What the admissions of one step share: a group's samples arrive together, with
    one ``extra_args`` object (vLLM's parallel sampling copies the parent's
    ``SamplingParams`` shallowly) and one problem.  Within one step nothing runs between
    them that could change that object or the length thresholds, and a problem's
    finished lengths change only where a reused request id seals the old request first
    (:meth:`RequestBook._state` then forgets the initial classes): its flags are read once
    per object and its initial class (Sec. 4.2.3's Init_r) computed once per (problem,
    max_tokens)."""

    __slots__ = ("_read", "initial")

    def __init__(self) -> None:
        # id(extra_args) -> (extra_args, its flags): the object is held, so its id is not
        # reused while the step's admissions run
        self._read: dict[int, tuple[Any, RLFlags | None]] = {}
        self.initial: dict[tuple[str, int], str] = {}

    def flags(self, extra_args: dict | None, request_id: str) -> RLFlags | None:
        """The flags of ``extra_args``, read for the first request that carries it."""
        if extra_args is None:
            return None
        seen = self._read.get(id(extra_args))
        if seen is None:
            seen = self._read[id(extra_args)] = (extra_args,
                                                 _das_flags(extra_args, request_id))
        return seen[1]


def _das_flags(extra_args: dict | None, request_id: str) -> RLFlags | None:
    """A request's flags, read once per request (:func:`vllm_rl.flags.read`: the
    canonical form the front end wrote).  Flags that do not read (the front end was
    bypassed) are logged once for the request, which is served without drafts."""
    return read_or_warn(extra_args, request_id, logger)


__all__ = ["RequestBook"]
