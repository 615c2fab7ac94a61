"""DAS under vLLM's async scheduling: drafts made while the previous step runs.

vLLM's async engine schedules step n + 1 and processes step n − 1's output while step n
runs, and keeps a step's sampled ids on the device.  ``patches/model_runner/das_async.py`` calls the
drafter around each step:

* :meth:`AsyncDrafts.after_sample` (step n sampled): each row's last token and count to
  vLLM, on the device (what its async speculative path corrects positions with), and
  the ids' copy to the host started;
* ``propose`` (:meth:`AsyncDrafts._begin_async`): the step's rows noted, no drafts;
* :meth:`AsyncDrafts.before_step` (step n + 1 about to be prepared, step n on the
  device): take in the steps before n (their copies are done), decide step n's rows'
  draft lengths, draft, and hand vLLM the drafts (``runner._draft_token_ids``, by step
  n's rows) and the worker's scheduler output with each sample's placeholders cut to
  its draft.

**The lookahead** (``DASConfig.lookahead``, default): nothing waits for step n.  A row's
context for step n + 1's draft is its window up to step n − 1, then the drafts it
verifies in step n, then step n's outcome, which is not known yet: the drafter drafts
for each hypothesis of it (:mod:`.hypotheses`: its most likely outcomes, a of its drafts
accepted and the tree's next token, one C++ call, :meth:`AsyncDrafts._branches`), and
the device takes the one step n's sampled tokens bear out
(:func:`.hypotheses.select_on_device`), queued behind step n's sampling.  Speculative
verification by rejection sampling is lossless for any proposal (vLLM's rejection
sampler; the field's zero-bubble speculative decoding, vllm#32951, prepares step n + 1
on the assumption of full acceptance, the last of these hypotheses): where no hypothesis
matches, the row verifies a draft made on a wrong context, which is rejected, not
wrong.  When step n is taken in, the host finds the hypothesis the device took
(:attr:`~.async_steps.InFlight.matched`, the same rule); the drafts of step n + 1 of a row that
matched none are known to be unsound and the next draft assumes they were rejected, so
a miss costs one step's drafts, never more.  vLLM then prepares step n + 1 under step
n's forward pass, as for a step without drafts: no host time on the step's path.

Without the lookahead a drafting step waits for step n's ids and drafts from them (the
drafts synchronous scheduling gives, one step later); that wait, the drafting after it
and vLLM's input preparation are host time on the step's path (``HOST.path_ns``;
:data:`PATH_ATTR`, measured by the patch).
"""
from __future__ import annotations

import os
import time
from itertools import repeat
from typing import Any

import numpy as np

from vllm_rl.cost.host import WORKER as HOST     # the drafter's host time, for the trace
from vllm_rl.das import hypotheses
from vllm_rl.das.context import ContextWindows
from vllm_rl.das.async_steps import (DraftPlan, InFlight, cut_to_drafts, on_device, padded,
                                     to_host, upload, verified_drafts)
from vllm_rl.das.state import StepRows
from vllm_rl.das.tree import BatchDrafts

PATH_ATTR = "_vllm_rl_path_from"   # runner: a drafting step's path, vLLM's part from here
PREP_ATTR = "_vllm_rl_prep_ns"     # runner: that part, measured (patches/model_runner/das_async.py)
HOST_DECAY = 0.1         # weight of the newest drafting step in draft_host_ms


class AsyncDrafts:
    """The drafter's hooks under async scheduling (a part of
    :class:`~.drafter.DASProposer`)."""

    def _init_async(self) -> None:
        # the context windows (the runner's token array holds placeholders), the step
        # sampled and not proposed yet, the steps proposed and not taken in (oldest
        # first), the last step proposed (the rows vLLM reads drafts by), the drafts it
        # verifies, and each request's drafts in the step being prepared
        self._windows = ContextWindows(self.cfg.max_depth, self.k_max + 1)
        # the hypotheses' threads: no more than the cores this process may run on
        cores = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                 else os.cpu_count() or 1)
        self._threads = max(1, min(self.cfg.threads, cores))
        self._sampled: InFlight | None = None
        self._in_flight: list[InFlight] = []
        self._taken: list[InFlight] = []            # the steps the last catch-up took in
        self._last: InFlight | None = None
        self._verifying = None                      # (rows, drafts, counts)
        self._drafted: dict[str, int] = {}
        self._wait_ns = 0                           # waited for the device, this step
        self._waited_at = 0                         # when the wait for the last ids ended
        self._path_ns: int | None = None            # the last drafting step's path so far
        # how the lookahead's hypotheses came out, by kind (hypotheses.tally)
        self.lookahead_totals = dict.fromkeys(hypotheses.TALLY, 0)

    @property
    def drafting(self) -> bool:
        """Under async scheduling: whether the drafter's last decision drafted for a row
        (:meth:`before_step` waits and drafts only then).  Each step's output carries it
        to the scheduler, which gives DAS samples placeholder drafts only while it holds
        (``RLScheduler._update_after_schedule``): where the batch cap has drafting off,
        no KV slots or token budget are held for drafts that never come."""
        return self._drafting

    @property
    def drafts_for(self) -> frozenset | None:
        """The requests the last decision drafts for when they are few (a probe of the
        cost cap, a few rows in the phase cap's bulk): the scheduler gives placeholder
        drafts to those only, not to the whole batch.  None: every DAS sample."""
        return self._drafts_for

    def after_sample(self, runner, sampled) -> None:
        """Step n sampled, under async scheduling (``patches/model_runner/das_async.py``, before
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
        host, event = to_host(sampled)
        self._sampled = InFlight(sampled=host, event=event, discard=discard, device=sampled)
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
        f.drafted = (np.fromiter(map(self._drafted.get, f.req_ids, repeat(0)), np.int64, n)
                     if self._drafted else np.zeros(n, dtype=np.int64))
        self._in_flight.append(f)
        self._last = f
        return torch.zeros((n, self.k_max), dtype=torch.int32, device=runner.device)

    def before_step(self, runner: Any, scheduler_output: Any):
        """Called by ``patches/model_runner/das_async.py`` before each step of an async engine, while
        the previous step n runs on the device.

        Takes in the steps before n (their ids are on the host: no wait), decides the
        draft lengths of step n's rows, and, when this step verifies drafts (the
        scheduler gave DAS samples placeholder slots and the drafter's last decision
        drafted), drafts them with the lookahead (:meth:`_plan`), in one tree call
        (:meth:`_tree_call`), and puts them where vLLM's async path reads them
        (``runner._draft_token_ids``, by step n's rows).  Nothing waits for step n: vLLM
        prepares this step's inputs while step n runs, as for a step without drafts.
        With ``DASConfig.lookahead`` off, a drafting step waits for step n's ids and
        drafts from them (the drafts synchronous scheduling gives, one step later).

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
            verifying, self._verifying = self._verifying, None
            feeds = self._catch_up(last=draft and not self.cfg.lookahead)
            f = self._last
            plan = None if f is None else self._plan(f, verifying, draft)
            ready = self._tree_call(feeds, plan)
            hyp = None
            if ready is not None:
                ready, hyp = self._take_guess(f, plan, ready)
            if feeds:
                # the steps just taken in may still be fed on the feeder thread (every one
                # of them), the steps in flight are not taken in yet: their requests are
                # sealed later, once fed
                steps = (*self._taken, *self._in_flight)        # f is in one of them
                self._retire(runner.requests, lambda rid: any(rid in g.ids for g in steps))
            self._drafted = {}
            if not spec:
                return scheduler_output, {}, None
            rows = dict(zip(f.req_ids, range(len(f.req_ids)))) if ready is not None else {}
            worker_output, cut, counts = cut_to_drafts(
                scheduler_output, rows, [] if ready is None else ready.lengths.tolist())
            self._drafted = counts
            if ready is not None:
                if hyp is None:
                    drafts = on_device(runner, padded(ready.drafts, len(rows), self.k_max))
                else:       # the hypothesis step n bears out, chosen on the device
                    drafts = hypotheses.select_on_device(
                        f.device, tuple(on_device(runner, x) for x in
                                        (hyp.tokens, hyp.drafts, hyp.fallback)))
                upload(runner, drafts, self.k_max, f.sched)
                self._verifying = (rows, ready.drafts if hyp is None else hyp.drafts, counts, f)
            return worker_output, cut, counts
        finally:
            end = time.perf_counter_ns()
            path = end - self._waited_at if self._waited_at else 0
            HOST.drafter_ns += end - t0 - path
            HOST.path_ns += path
            if path:                 # vLLM's input preparation goes on the path too
                self._path_ns = path
                runner.__dict__[PATH_ATTR] = end

    def _catch_up(self, last: bool) -> list[StepRows]:
        """Count the async steps whose tokens were not taken in yet, in order (all of
        them with ``last``, waiting for the last one's ids; else all but the last, whose
        copies are done: no wait).  Returns their rows, to be fed by the next tree call
        (:meth:`_tree_call`)."""
        todo = self._in_flight[:] if last else self._in_flight[:-1]
        self._taken = todo
        if self._detached:          # reused ids' old requests: the last tree call fed them
            self._wait_feed()
            self._seal_detached()
        if not todo:
            return []
        # the feeder's last call first: a natural end taken in here is fed and sealed at
        # once, after its rollout's earlier tokens (off the step's path: step n runs)
        self._wait_feed()
        del self._in_flight[:len(todo)]
        steps = []
        for j, f in enumerate(todo):
            # waiting for the step that just ran: what follows is on the step's path
            steps.append(self._ingest_async(f, path=last and j == len(todo) - 1))
            f.fed = True
        return steps

    def _ingest_async(self, f: "InFlight", path: bool = False) -> StepRows:
        """One async step's tokens on the host (:meth:`_ingest`) and in the requests'
        context windows; its rows, with what each feeds.  ``path``: the step just ran
        (the device has nothing queued): the time from its ids on is the step's path."""
        if f.event is not None:
            t0 = time.perf_counter_ns()
            f.event.synchronize()
            self._wait_ns += time.perf_counter_ns() - t0
        if path:
            self._waited_at = time.perf_counter_ns()
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
            step = self._rows(f.owners, None, f.req_ids, tokens, offsets, None, memo=f)
            S, win = self.slots, self._windows
            if f.hyps is not None:     # which of the lookahead's hypotheses the step bore out
                rows = np.flatnonzero(step.slots >= 0)
                f.matched = hypotheses.match(arr, f.hyps)
                S.guess_ok[step.slots[rows]] = f.matched[rows] >= 0
                hypotheses.tally(arr, f.hyps, f.matched, self.lookahead_totals)
            step.ntok = f.n_prompt + lens + np.where(step.slots >= 0, S.generated[step.safe], 0)
            win.append(np.where(S.done[step.safe], -1, step.slots), tokens, offsets)
            self._ingest(step, f.drafted)
        finally:
            self._sched = sched
        return step

    def _plan(self, f: "InFlight", verifying, draft: bool):
        """The draft lengths of the rows of the last step ``f`` (vLLM's async path reads
        the drafts by its rows) for the step after it, and the contexts they draft from.

        ``f`` taken in (:attr:`InFlight.fed`): the contexts are known.  Not yet (the
        lookahead, ``DASConfig.lookahead``): ``f`` is still on the device, and each
        row's context is its window (up to the step before ``f``) followed by the drafts
        ``f`` verifies (``verifying``, as the device chose them) and ``f``'s outcome,
        one draft per hypothesis of it (:meth:`_branches`).  A row whose drafts in
        ``f`` were made on an outcome of the step before that did not come true (known
        once that step is taken in) is assumed to have them rejected: its hypotheses
        are its next token only.  Returns the :class:`~.async_steps.DraftPlan` (None without ``draft``:
        lengths decided only)."""
        n = len(f.req_ids)
        empty = np.zeros(0, dtype=np.int32)
        step = self._rows(f.owners, None, f.req_ids, empty, np.zeros(n + 1, np.int64), None,
                          memo=f)
        S = self.slots
        das = step.slots >= 0
        generated = np.where(das, S.generated[step.safe], 0)
        extra, k, d = 0, None, None
        if not f.fed:
            k, d = verified_drafts(verifying, f.req_ids, self.k_max)
            # drafts made on a guess that the step before did not bear out are assumed
            # rejected: the row is assumed to take only its bonus token
            k = np.where(das & ~S.guess_ok[step.safe], 0, k)
            extra = 1
            step.ahead = np.where(das, k + extra, 0)
            step.ntok = f.n_prompt + generated + step.ahead
        else:
            step.ntok = f.n_prompt + generated
        live = np.flatnonzero(das & ~S.done[step.safe] & ~f.discard)
        phase = self._decide(f.req_ids, step, live, draft)
        if not draft:
            return None
        contexts, context_len = self._windows.view(step.slots)
        return DraftPlan(step, contexts, context_len, phase, extra, k, d)

    def _tree_call(self, feeds: list[StepRows], plan) -> Any:
        """One C++ call for the step: the counted tokens of ``feeds`` into their trees
        (with ``DASConfig.background_feed``, on the feeder thread after the call instead:
        every row under the lookahead, the rows not drafting now without it), then the
        drafts of ``plan``'s rows.  The feeder's previous call is waited for first, so a
        draft sees the same trees run after run.  Returns the drafts (None: no plan)."""
        self._wait_feed()
        draft_rows = plan.step if plan is not None else None
        drafting = (draft_rows.slots[draft_rows.max_tokens > 0]
                    if draft_rows is not None else np.zeros(0, np.int64))
        S = self.slots
        parts, later = [], []
        for st in feeds:
            if not st.feed.any():
                continue
            seqs = np.where(st.slots >= 0, S.seq[st.safe], -1)
            if self.cfg.background_feed:
                # off the call: every row under the lookahead (its drafts read the window,
                # not its rollout in the tree), else the rows not drafting now
                bg = st.feed if self.cfg.lookahead else st.feed * ~np.isin(st.slots, drafting)
                if bg.any():
                    later.append((seqs, st.tokens, st.offsets, bg))
                st.feed = st.feed - bg
            if st.feed.any():
                parts.append((seqs, st.tokens, st.offsets, st.feed))
        res = None
        if plan is not None and plan.extra:            # the lookahead: its hypotheses
            if parts:
                self._call(parts, None)
            res = self._branches(plan)
        elif plan is not None:
            step = plan.step
            seqs = np.where(step.slots >= 0, S.seq[step.safe], -1)
            want = np.where(step.max_tokens > 0, step.max_tokens + plan.extra, 0)
            res = self._call(parts, (seqs, plan.contexts, plan.context_len,
                                     want.astype(np.int32), self._min_prob(step)))
        elif parts:
            self._call(parts, None)
        self._feed_in_background(later)
        return res

    def _call(self, feeds: list, drafts):
        """``feed_and_draft`` over the feeding rows of ``feeds`` followed by the drafting
        rows of ``drafts`` (one call: every draft sees every feed)."""
        seqs, toks, offs, feed = [], [], [], []
        base = 0
        for sq, tk, of, fd in feeds:
            seqs.append(sq)
            toks.append(tk)
            offs.append(of[:-1] + base)
            feed.append(fd)
            base += int(of[-1])
        m = sum(len(x) for x in seqs)
        if drafts is not None:
            dseqs, contexts, context_len, want, min_prob = drafts
            nd = len(dseqs)
            seqs.append(dseqs)
            offs.append(np.full(nd, base, dtype=np.int64))
            feed.append(np.zeros(nd, dtype=np.int32))
        else:
            nd, contexts = 0, np.zeros((0, 1), np.int32)
        width = contexts.shape[1]
        all_ctx = np.zeros((m + nd, width), dtype=np.int32)
        all_ctx[m:] = contexts
        all_len = np.zeros(m + nd, dtype=np.int32)
        all_want = np.zeros(m + nd, dtype=np.int32)
        all_p = np.zeros(m + nd)
        if nd:
            all_len[m:], all_want[m:], all_p[m:] = context_len, want, min_prob
        res = self.store.feed_and_draft(
            np.concatenate(seqs).astype(np.int64),
            np.concatenate(toks).astype(np.int32) if toks else np.zeros(0, np.int32),
            np.concatenate(offs + [np.array([base], dtype=np.int64)]),
            np.concatenate(feed).astype(np.int32), all_ctx, all_len, all_want, all_p,
            backoff=True)
        self.host_ns["feed"] += res.feed_ns
        self.host_ns["draft"] += res.draft_ns
        return res._replace(drafts=res.drafts[m:], lengths=res.lengths[m:])

    def _branches(self, plan: "DraftPlan") -> hypotheses.Hypotheses:
        """The lookahead's hypotheses for the drafting rows of ``plan`` (one C++ call,
        :func:`.hypotheses.build`): per row, of the outcomes of the step on the device
        (a of its drafts accepted, then one of the ``DASConfig.branches`` most frequent
        next tokens in its tree other than the rejected draft), the most likely
        (:func:`.hypotheses.most_likely`), each with its draft."""
        step, S, cfg = plan.step, self.slots, self.cfg
        seqs = np.where(step.slots >= 0, S.seq[step.safe], -1)
        most = (hypotheses.most_likely(int((step.max_tokens > 0).sum()), cfg.hypotheses,
                                       cfg.step_hypotheses)
                if cfg.step_hypotheses else cfg.hypotheses)
        hyp, ns = hypotheses.build(self.store, seqs, plan.contexts, plan.context_len, plan.d,
                                   plan.k, step.max_tokens, self._min_prob(step),
                                   cfg.branches, most, self._threads)
        self.host_ns["draft"] += ns
        return hyp

    def _take_guess(self, f: "InFlight", plan: "DraftPlan", res):
        """The drafts of the step being prepared and, under the lookahead, the
        hypotheses they were made on (``res``; kept on ``f``, whose outcome they guess,
        checked when ``f`` is taken in): each row verifies the slots its hypotheses
        pay for together (:mod:`.hypotheses`).  The phase cap's cut last.  Returns
        (drafts, hypotheses or None)."""
        hyp = None
        if plan.extra:
            hyp = f.hyps = res.without(f.discard)
            res = BatchDrafts(hyp.fallback_drafts(), hyp.draft_len, 0, 0)
        if plan.phase is not None:
            self._phase_cut(plan.phase, res.lengths)
        self._note_width(res.lengths, plan.step.n)
        return res, hyp


__all__ = ["AsyncDrafts", "PATH_ATTR", "PREP_ATTR"]
