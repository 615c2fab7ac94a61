"""The DAS drafter's requests: admission, each step's counts, natural ends, sealing.

A request is admitted the first time the drafter sees it in the runner (its flags read
once, :func:`vllm_rl.flags.read_or_warn`; a reused request id is a new rollout), takes a
row of :class:`~.request_columns.Slots` and starts a rollout in its problem's tree
(:mod:`.store`).  Per step, over the step's rows as arrays (:class:`~.state.StepRows`):
Eq. 3's counts of the drafts each row was verified on (:meth:`RequestBook._verify`),
its new tokens counted for the step's tree call and its natural end found (a stop
token, ``max_tokens``, the model length: sealed at once, :meth:`RequestBook._feed`).
A request that leaves the runner is sealed into its problem's window
(:meth:`RequestBook._retire`).  A round (one rollout batch) ends when no DAS request is
left; its N_fwd, the most forward passes any of its requests took (Eq. 4), feeds
T_short (Sec. 4.2.3).

Python runs per request only at its admission, its natural end and its departure; the
rest is array operations over the step's rows.  The admissions of one step are one
batch (:meth:`RequestBook._admit`): per request its own reads and state, then their
slot columns, context windows and rollouts in the trees (one tree call) at once; they
share their reads (:class:`_Admissions`): a group's flags and stop ids are read once
per object and its problem's initial class (Init_r, Sec. 4.2.3) once per (problem,
``max_tokens``, budget).
"""
from __future__ import annotations

import operator
from collections import Counter
from itertools import repeat
from typing import Any

import numpy as np
from vllm.logger import init_logger

from vllm_rl.das import length_classes
from vllm_rl.das.config import default_problem_id
from vllm_rl.das.request_columns import FIXED, POLICY_CODES, Slots
from vllm_rl.das.state import RequestState, Round, StepRows
from vllm_rl.flags import RLFlags, read_or_warn

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

        ``memo`` (an async step's :class:`~.async_steps.InFlight`, mapped twice: its
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
            new = np.flatnonzero(~known).tolist()
            if new:
                self._admit(req_ids, owners, batch, new)
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
        are not the sample's) and seal the rollouts that ended naturally (their last
        tokens fed here, in one tree call, then each sealed).  The others are fed by
        the step's batched call (``step.feed``).  Returns the rows that go on."""
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
        ended = rows[ends]
        if len(ended):          # their last tokens into their trees (one call), then sealed
            # row i's tokens start at offsets[i] (ended rows ascend), its first feed[i]
            offsets = np.append(step.offsets[ended], step.offsets[-1])
            self.store.feed(S.seq[step.slots[ended]], step.tokens, offsets, feed[ended])
            feed[ended] = 0
            for slot in step.slots[ended].tolist():
                self._finish(self._by_slot[slot], natural=True)
        return rows[~ends]

    def _admit(self, req_ids, owners, batch, rows: list[int]) -> None:
        """The requests of ``rows`` seen for the first time, in row order.  A reused id
        (a new request under an old one's id) first detaches or seals the old request;
        its seal may slide its problem's window, so the admissions before it are
        written first and the initial classes are read again after it."""
        memo = _Admissions()
        start = 0
        for j, i in enumerate(rows):
            rid = req_ids[i]
            if rid not in self.requests:
                continue
            self._admit_rows(req_ids, owners, batch, rows[start:j], memo)
            start = j
            if self._asynchronous:
                self._detach(rid)
            else:
                self._seal(rid)
                memo.initial.clear()
        self._admit_rows(req_ids, owners, batch, rows[start:], memo)

    def _admit_rows(self, req_ids, owners, batch, rows: list[int],
                    memo: "_Admissions") -> None:
        """New requests (none of them under a reused id): per request what is its own
        (flags, read once per ``extra_args`` object; its problem, budget, stop ids and
        :class:`RequestState`, :meth:`_start`), then the slot columns, context windows
        and running stop ids of all of them at once."""
        das = []
        for i in rows:
            rid, cached = req_ids[i], owners[i]
            params = getattr(cached, "sampling_params", None)
            flags = memo.flags(getattr(params, "extra_args", None), rid)
            self._owner[rid] = cached
            if flags is None or flags.das is None:
                self.requests[rid] = None
            else:
                das.append((i, rid, cached, params, flags))
        if not das:
            return
        self._wait_feed()                 # the feeder thread's call writes the trees too
        S = self.slots
        slots = S.take_many(len(das))
        cols = _Columns(len(das))
        states, fed = [], []
        for j, ((i, rid, cached, params, flags), slot) in enumerate(zip(das, slots.tolist())):
            st, first = self._start(flags, params, cached, batch, i, slot, memo, cols, j)
            states.append(st)
            fed.append(first)
            self.requests[rid] = st
            self._slot_of[rid] = slot
            self._by_slot[slot] = st
        cols.seq[:] = self.store.start_many([st.problem for st in states], fed)
        for st, seq in zip(states, cols.seq.tolist()):
            st.seq = seq
        cols.write(S, slots)
        if cols.force.any():
            self._forcing = True
        if self._asynchronous:
            self._windows.start_many(slots, cols.tails)
        self._running += len(das)
        for ids, n in Counter(cols.stop_ids).items():
            self._add_stops(ids, n)

    def _start(self, flags: RLFlags, params, cached, batch, i: int, slot: int,
               memo: "_Admissions", cols: "_Columns", j: int) -> tuple[RequestState, list]:
        """A new rollout in ``slot`` (its sequence id in the store is set once every
        admission of the step has started, :meth:`ProblemTrees.start_many`) and its
        columns into ``cols[j]``; returns its state and the tokens its rollout in the
        tree starts with (the prompt's tail).  A continuation (partial rollouts) ends
        its prompt with its ``prior`` tokens from earlier steps: its rollout in the
        tree, its length and its length class are the whole sample's."""
        das = flags.das
        prior = flags.partial.prior_tokens if flags.partial is not None else 0
        prompt = cached.prompt_token_ids or []
        n_prompt = len(prompt) if prompt or batch is None else int(batch.num_prompt_tokens[i])
        n_original = n_prompt - prior
        problem = das.problem_id or default_problem_id(None, prompt[:n_original])
        first = list(prompt[max(0, n_original - self.cfg.prompt_tail):n_prompt])
        max_tokens = prior + (params.max_tokens or (self.max_model_len - n_prompt))
        b = self.cfg.budget if das.budget is None else min(das.budget, self.cfg.budget)
        init, class_budget = memo.initial_class(self, problem, max_tokens, b)
        name = das.policy or self.cfg.policy
        st = RequestState(
            problem=problem, seq=-1, flags=das, max_tokens=max_tokens, budget=b,
            min_prob=self.cfg.draft_cutoff if das.min_prob is None else das.min_prob,
            slot=slot, slots=self.slots, init_class=init, stop_ids=memo.stop_ids(params),
            budget_policy=name)
        cols.max_tokens[j], cols.budget[j], cols.generated[j] = max_tokens, b, prior
        cols.policy[j] = POLICY_CODES.get(name, FIXED)
        cols.rank[j] = length_classes.CLASSES.index(init)
        cols.class_budget[j] = class_budget
        cols.min_prob[j] = st.min_prob
        cols.force[j] = bool(das.force)
        cols.problem_key[j] = self._problem_key(problem)
        cols.stop_ids.append(st.stop_ids)
        cols.tails.append((prompt, n_prompt))
        return st, first

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

    def _add_stops(self, ids: frozenset, n: int) -> None:
        """The stop ids any running request has (a token among them is checked against
        its own row's stop ids): ``n`` requests with ``ids`` started (n > 0) or ended."""
        before = len(self._stops)
        for t in ids:
            self._stops[t] += n
            if self._stops[t] <= 0:
                del self._stops[t]
        if len(self._stops) != before:          # the set changed (n is one way)
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
    one ``extra_args`` object and one ``SamplingParams`` (vLLM's parallel sampling
    copies the parent's shallowly) and one problem.  Within one step nothing runs
    between them that could change those objects or the length thresholds, and a
    problem's finished lengths change only where a reused request id seals the old
    request first (:meth:`RequestBook._admit` then forgets the initial classes): flags
    and stop ids are read once per object, a problem's initial class (Sec. 4.2.3's
    Init_r) once per (problem, max_tokens, budget)."""

    __slots__ = ("_read", "_stops", "initial")

    def __init__(self) -> None:
        # id(object) -> (object, what was read): the object is held, so its id is not
        # reused while the step's admissions run
        self._read: dict[int, tuple[Any, RLFlags | None]] = {}
        self._stops: dict[int, tuple[Any, frozenset]] = {}
        self.initial: dict[tuple[str, int, int], tuple[str, int]] = {}

    def flags(self, extra_args: dict | None, request_id: str) -> RLFlags | None:
        """The flags of ``extra_args``, read for the first request that carries it."""
        if extra_args is None:
            return None
        seen = self._read.get(id(extra_args))
        if seen is None:
            seen = self._read[id(extra_args)] = (extra_args,
                                                 _das_flags(extra_args, request_id))
        return seen[1]

    def initial_class(self, book: "RequestBook", problem: str, max_tokens: int,
                      b: int) -> tuple[str, int]:
        """A new request's initial length class (Init_r) and that class's budget for
        its ``b`` (Sec. 4.2.3)."""
        key = (problem, max_tokens, b)
        seen = self.initial.get(key)
        if seen is None:
            init = book.classes.initial(book.store.lengths(problem), max_tokens)
            seen = self.initial[key] = (init, book.classes.budget(init, b))
        return seen

    def stop_ids(self, params) -> frozenset:
        """The token ids that end a request with ``params``: its stop tokens, and EOS
        unless it ignores EOS."""
        seen = self._stops.get(id(params))
        if seen is None:
            ids = set(params.all_stop_token_ids or ())
            if params.eos_token_id is not None and not params.ignore_eos:
                ids.add(params.eos_token_id)
            seen = self._stops[id(params)] = (params, frozenset(ids))
        return seen[1]


class _Columns:
    """The :class:`~.request_columns.Slots` columns of one batch of admissions, filled per request
    by :meth:`RequestBook._start` and written at once (:meth:`write`); with each one's
    stop ids and prompt (its context window starts with the prompt's last
    ``max_depth`` tokens)."""

    _INT = ("seq", "max_tokens", "budget", "generated", "class_budget", "problem_key")

    def __init__(self, n: int) -> None:
        for name in self._INT:
            setattr(self, name, np.zeros(n, dtype=np.int64))
        self.policy = np.zeros(n, dtype=np.int8)
        self.rank = np.zeros(n, dtype=np.int8)
        self.min_prob = np.zeros(n)
        self.force = np.zeros(n, dtype=bool)
        self.stop_ids: list[frozenset] = []
        self.tails: list[tuple[list, int]] = []    # (prompt, its length) per request

    def write(self, slots: "Slots", rows: np.ndarray) -> None:
        for name in self._INT + ("policy", "rank", "min_prob", "force"):
            getattr(slots, name)[rows] = getattr(self, name)


def _das_flags(extra_args: dict | None, request_id: str) -> RLFlags | None:
    """A request's flags, read once per request (:func:`vllm_rl.flags.read`: the
    canonical form the front end wrote).  Flags that do not read (the front end was
    bypassed) are logged once for the request, which is served without drafts."""
    return read_or_warn(extra_args, request_id, logger)


__all__ = ["RequestBook"]
