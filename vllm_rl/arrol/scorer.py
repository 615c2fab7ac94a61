"""The quality head on the worker: score each sample in the step that computes its
``l_detect``-th token, and decide its survival (Alg. 1 l.15-19; App. A.4, Eq. 1-2).

Which row: a sample with ``arrol.l_detect = L`` and a prompt of ``n`` tokens is scored
from the final-norm hidden state at position ``P = n + L - 1``, its ``L``-th generated
token, in the step whose query covers ``P``.  That step is the one after the token was
sampled (a token's hidden state is computed when it is the input), or the step that
verifies it as an accepted draft (DAS): a draft position counts only if every draft up
to it was accepted, since only then is the token there the sample's own.  A preempted
sample recomputed from its prompt is never scored twice (each request id once).  A
sample whose ``L``-th token ends it is never computed at ``P`` and is not scored:
nothing is left to prune.

Trace features: until a sample is scored, every step also reads the raw logits rows of
its new tokens (before the sampler divides them by the temperature in place): one fused
pass per row gives its log-normaliser and entropy (:func:`vllm_rl.kernels.logsumexp_entropy`,
no ``[rows, V]`` log-softmax), and after sampling each kept token's log-probability
(``z_tok - lse``, one gather) and its distribution's entropy are added to the sample's
running sums, which stay on the device (a ``[3, slots]`` tensor: Σ log p, min log p,
Σ entropy).  At ``l_detect`` the head may read their mean / minimum / mean entropy
(:data:`~vllm_rl.arrol.rule.TRACE_FEATURES`) beside the hidden state, and the verdict
carries them to the record.  A token counts once it is the sample's own: a draft only if
accepted.  With vLLM's async output the step's sampled ids stay on the device (-1 past
a row's accepted tokens) and are read there; the host knows how many tokens the sums
hold from vLLM's own count (``num_computed_tokens_cpu``, which vLLM corrects for the
last step's rejected drafts before it samples), so DAS drafts before ``l_detect``
under async scheduling too.

What: every scored row of a step goes through the head in one call
(:func:`vllm_rl.kernels.score_rows`: Triton on CUDA, PyTorch on the CPU); with the
calibration pushed by the trainer the score becomes q (App. A.4: Eq. 1 and Bayes) and p
(Eq. 2), and the sample's coin (its seed and prompt, :func:`vllm_rl.arrol.rule.prune_coin`)
prunes it with probability 1 - p.  Without a calibration (cold start) it is scored, not
pruned.

No host–device synchronisation is added to the step.  Every crossing goes through
:class:`Transfer`: index tensors built on the host go up from pinned memory without
blocking; the per-row results (score and trace features, ``[R, 4]``, and the hidden
rows of ``return_hidden`` samples) come down without blocking into pinned memory in
:meth:`HeadScorer.plan`, before vLLM samples, and are read only after a point where vLLM
itself has waited for the device in that step:

* synchronous scheduling: vLLM's ``_bookkeeping_sync`` turns the sampled tokens into
  lists (``_to_list``: an event recorded after our copies on the same stream, then
  synchronised; with drafts ``RejectionSampler.parse_output`` copies them to the host):
  the verdicts are decided in :meth:`HeadScorer.finish`;
* async scheduling: ``AsyncGPUModelRunnerOutput.get_output`` waits on its copy event,
  recorded on a stream that first waited for the compute stream, so after our copies:
  the scorer defers its decision to that wait (:meth:`vllm_rl.step_output.StepOutput.defer`,
  run by the ``get_output`` patch) and decides there, on the ``ModelRunnerOutput`` it
  returns.

The step's own event (:meth:`Transfer.ready`) is waited on at that point too; it has
completed already, and would only block if a future vLLM stopped synchronising there.

Where the verdicts go: the step's :class:`vllm_rl.step_output.StepOutput` (``verdicts``,
``{request id: ArrolVerdict}``), read by the scheduler in the same step
(:mod:`vllm_rl.engine.scheduler`).  It crosses vLLM's multiprocess executor pickled
with the output.
A hidden state (``return_hidden``) does not travel with it: it stays in the scorer's
:class:`~vllm_rl.arrol.hidden.HiddenStore` under the request id, the verdict says so
(``hidden=True``), and the client takes it with the ``arrol_hidden`` RPC
(:meth:`HeadScorer.take_hidden`).
"""
from __future__ import annotations

import logging
from collections import deque
from time import perf_counter_ns
from typing import Any

import numpy as np
import torch

from vllm_rl.arrol import rule
from vllm_rl.arrol.config import ArrolConfig
from vllm_rl.arrol.hidden import HiddenStore
from vllm_rl.arrol.served_head import initial_head, updated_head
from vllm_rl.arrol.step_plan import EMPTY, Candidate, Plan
from vllm_rl.arrol.trace_sums import TraceSums, token_logprob
from vllm_rl.arrol.transfer import Transfer
from vllm_rl.cost.host import WORKER as HOST     # the scorer's host time, for the trace
from vllm_rl.flags import KEY, ArrolFlags, read_or_warn
from vllm_rl.step_output import attach

RUNNER_ATTR = "vllm_rl_scorer"   # GPUModelRunner: its HeadScorer, or None off ARRoL
FLAG_CACHE = 4096            # parsed flags kept by the identity of their extra_args
logger = logging.getLogger(__name__)


class _Req:
    """A sample the scorer still has to score: its flags and its trace slot (its column
    of the device sums; its ``l_detect`` is the slot's entry of ``TraceSums.limit``;
    how many tokens the sums hold, each step's from vLLM's token counts)."""

    __slots__ = ("rid", "owner", "flags", "share", "slot")

    def __init__(self, rid: str, owner: Any, flags: ArrolFlags, share: float,
                 slot: int) -> None:
        self.rid, self.owner, self.flags, self.share, self.slot = (
            rid, owner, flags, share, slot)


def scorer_of(runner) -> "HeadScorer | None":
    """The runner's scorer, made on first use on an ARRoL engine (its additional_config
    names the head); None, remembered, on any other engine."""
    scorers = runner.__dict__
    if RUNNER_ATTR not in scorers:
        cfg = ArrolConfig.from_vllm_config(runner.vllm_config)
        scorers[RUNNER_ATTR] = None if cfg is None else HeadScorer(
            cfg, runner.model_config.get_hidden_size(), runner.device)
    return scorers[RUNNER_ATTR]


def read_flags(owner: Any, rid: str) -> tuple[ArrolFlags, float] | None:
    """A request's ARRoL flags from the canonical form the front end wrote, and DARTS's
    share M/M' of its group (0 outside DARTS: Eq. 2's p acts on the redundant M' − M
    only, :func:`vllm_rl.arrol.rule.composed_survival`); None without ARRoL, or when the
    flags do not read (logged once)."""
    extra = getattr(getattr(owner, "sampling_params", None), "extra_args", None)
    parsed = read_or_warn(extra, rid, logger) if extra else None
    if parsed is None or parsed.arrol is None:
        return None
    g = parsed.group
    share = 0.0
    if parsed.darts is not None and g is not None:
        share = rule.darts_share(g.size, g.redundant)
    return parsed.arrol, share


class HeadScorer:
    """Per model runner: the current :class:`Head`, the samples still to score with
    their trace sums on the device, and the hidden states kept for the client."""

    def __init__(self, cfg: ArrolConfig, hidden_size: int, device,
                 hidden_store: HiddenStore | None = None) -> None:
        self.hidden_size = hidden_size
        self.device = device
        self.cfg = cfg
        self.xfer = Transfer(device)
        self.hidden_store = hidden_store if hidden_store is not None else HiddenStore()
        self._reqs: dict[str, _Req] = {}           # request id -> sample still to score
        self._settled: deque[str] = deque()        # scored at a draft (any thread)
        self.sums = TraceSums(device)              # trace sums of samples to score
        self._flag_cache: dict[int, tuple[Any, ArrolFlags | None]] = {}
        self.scored_total = 0
        self.pruned_total = 0
        self.scored_at_draft = 0            # scored at an accepted draft position (DAS)
        self.head = initial_head(cfg, hidden_size, device)

    def update(self, head: Any = None, calibration: Any = None, cold_start: bool = False,
               version: int | None = None) -> int:
        """Replace the head and/or the calibration between steps; returns the version
        (:func:`vllm_rl.arrol.served_head.updated_head`: a bad update raises and leaves
        the current head serving)."""
        self.head = updated_head(self.head, self.hidden_size, self.device, head,
                                 calibration, cold_start, version)
        return self.head.version

    def info(self) -> dict[str, Any]:
        h = self.head
        return {"version": h.version, "hidden_size": self.hidden_size,
                "width": int(h.w1.shape[0]), "activation": h.activation,
                "features": list(rule.TRACE_FEATURES) if h.w1f is not None else [],
                "calibrated": h.calibration is not None,
                "calibration": h.calibration.to_dict() if h.calibration else None,
                "scored": self.scored_total, "pruned": self.pruned_total,
                "scored_at_draft": self.scored_at_draft,
                "hidden_kept": len(self.hidden_store),
                "hidden_dropped": self.hidden_store.dropped}

    def take_hidden(self, request_ids) -> dict[str, np.ndarray]:
        """Remove and return the hidden states kept for these request ids (the records'
        ``hidden_id``): request id -> float32 vector [hidden_size]; ids with none kept
        (not ``return_hidden``, not scored, already taken, or dropped past the store's
        capacity) are absent."""
        return self.hidden_store.take(request_ids)

    # ------------------------------------------------------------------ requests
    def _release(self, st: _Req) -> None:
        if st.slot >= 0:
            self.sums.give_back(st.slot)
            st.slot = -1

    def _drop(self, rid: str) -> None:
        st = self._reqs.pop(rid, None)
        if st is not None:
            self._release(st)

    def _admit(self, runner, so) -> None:
        """The step's new requests (vLLM makes a runner state for a request only there)
        and its finished ones; a request id that comes back is a new sample."""
        for rid in getattr(so, "finished_req_ids", ()) or ():
            self._drop(rid)
        for new in getattr(so, "scheduled_new_reqs", ()) or ():
            rid = new.req_id
            self._drop(rid)
            owner = runner.requests.get(rid)
            got = self._flags_of(owner, rid) if owner is not None else None
            if got is not None:
                flags, share = got
                self._reqs[rid] = _Req(rid, owner, flags, share, self.sums.take(flags.l_detect))
        if len(self._reqs) > 4 * runner.input_batch.num_reqs + 256:
            live = runner.requests
            for rid in [r for r, st in self._reqs.items() if live.get(r) is not st.owner]:
                self._drop(rid)

    def _flags_of(self, owner: Any, rid: str) -> tuple[ArrolFlags, float] | None:
        """:func:`read_flags`, once per ``extra_args`` object (the samples of an ``n > 1``
        request share their parent's); a canonical section without ARRoL is not read."""
        extra = getattr(getattr(owner, "sampling_params", None), "extra_args", None)
        if not extra:
            return None
        section = extra.get(KEY)
        if type(section) is dict and "arrol" not in section and len(extra) == 1:
            return None
        hit = self._flag_cache.get(id(extra))
        if hit is not None and hit[0] is extra:
            return hit[1]
        flags = read_flags(owner, rid)
        if len(self._flag_cache) >= FLAG_CACHE:
            self._flag_cache.pop(next(iter(self._flag_cache)))
        self._flag_cache[id(extra)] = (extra, flags)    # held: its id is not reused
        return flags

    def _settle(self) -> None:
        """Samples scored at an accepted draft leave (decided after the step)."""
        while self._settled:
            self._drop(self._settled.popleft())

    # ------------------------------------------------------------------ per step
    def plan(self, runner, state) -> Plan | None:
        """Before sampling: the rows whose ``l_detect``-th token this step computes,
        scored in one call with their trace features, and the log-normaliser and entropy
        of the logits rows whose tokens feed the traces of samples not yet scored; the
        results start to the host without blocking.  Acceptance of draft rows is settled
        after sampling.  Its host time goes to the step trace
        (:data:`vllm_rl.cost.host.WORKER`)."""
        t0 = perf_counter_ns()
        try:
            with torch.inference_mode():
                return self._plan(runner, state)
        finally:
            HOST.scorer_ns += perf_counter_ns() - t0

    def _plan(self, runner, state) -> Plan | None:
        self._settle()
        so = state.scheduler_output
        self._admit(runner, so)
        reqs = self._reqs
        if not reqs:
            return None
        get = runner.input_batch.req_id_to_index.get
        sts, idx, slots = [], [], []
        for st in reqs.values():
            i = get(st.rid)
            if i is not None:
                sts.append(st)
                idx.append(i)
                slots.append(st.slot)
        if not sts:
            return None
        batch = runner.input_batch
        # per tracked sample: its row in the batch, its trace slot, its l_detect, its
        # query and drafts in this step, the tokens it has before this step (``traced``:
        # exact, since vLLM has taken the last step's rejected drafts off
        # ``num_computed_tokens_cpu`` before it samples, under async scheduling too:
        # ``GPUModelRunner.execute_model`` ends with that correction), and where
        # P = n + l_detect - 1 falls in this step's query (``at``; scored this step iff
        # 0 <= at < its query length)
        batch_row, slot_ids = np.array(idx), np.array(slots)
        l_detect = self.sums.limit[slot_ids]
        qsl = runner.query_start_loc.np
        start = qsl[batch_row]
        n_sched = qsl[batch_row + 1] - start           # this step's query of each sample
        meta = state.spec_decode_metadata
        if meta is None:
            nd = np.zeros(len(sts), dtype=np.int64)
        else:
            nd_all = np.asarray(meta.num_draft_tokens, dtype=np.int64)
            nd = nd_all[batch_row]
            draft0 = np.cumsum(nd_all) - nd_all        # each row's first draft token
        computed = batch.num_computed_tokens_cpu[batch_row]
        n_prompt = batch.num_prompt_tokens[batch_row]
        traced = np.maximum(computed + n_sched - nd - n_prompt, 0)
        at = n_prompt + l_detect - 1 - computed
        found = np.flatnonzero((at >= 0) & (at < n_sched))
        logits = state.logits
        plan = Plan(self.head)
        if logits is not None:
            t = np.flatnonzero(traced < l_detect)
            if meta is None:                           # one logits row per sample
                first, count = batch_row[t], np.ones(len(t), dtype=np.int64)
            else:                                      # 1 + its drafts
                first = (draft0 + np.arange(len(nd_all)))[batch_row[t]]   # 1 + drafts each
                count = np.minimum(nd[t] + 1, (l_detect - traced)[t])
            k = np.cumsum(count) - count
            plan.t_slot, plan.t_index = slot_ids[t], batch_row[t]
            plan.t_k, plan.t_count = k, count
            lrows = np.repeat(first - k, count) + np.arange(int(count.sum()))
            tracked_k = np.full(len(sts), -1, dtype=np.int64)
            tracked_k[t] = k
        else:
            lrows = EMPTY
        if not len(found) and not plan.tracked:
            return None
        # the scored samples: their hidden/logits row, trace slot and trace count, the
        # hidden rows to keep; this step's accepted-draft tokens before each scored row
        # (draft_of: which scored sample, draft_row: its tracked logits row, draft_at:
        # the token's index in vLLM's draft tokens of the step, read there on the device:
        # under async scheduling the host holds only placeholders)
        scored_row = (start + at)[found]
        scored_slot = slot_ids[found]
        scored_count = traced[found].copy()
        hidden_rows, draft_of, draft_row, draft_at = [], [], [], []
        for j, c in enumerate(found.tolist()):
            st = sts[c]
            # the drafts to be accepted for P's token to be the sample's own
            needs = max(0, int(at[c]) - int(n_sched[c] - nd[c]) + 1) if nd[c] else 0
            hidden = -1
            if st.flags.return_hidden:
                hidden = len(hidden_rows)
                hidden_rows.append(int(scored_row[j]))
            plan.rows.append(Candidate(st.rid, st.owner, st.flags, st.share, needs, hidden))
            if needs and logits is not None and tracked_k[c] >= 0:
                extra = min(needs, int(plan.t_count[np.searchsorted(plan.t_k, tracked_k[c])]))
                k0, d0 = int(tracked_k[c]), int(draft0[batch_row[c]])
                draft_of.extend([j] * extra)
                draft_row.extend(range(k0, k0 + extra))
                draft_at.extend(range(d0, d0 + extra))
                scored_count[j] += extra
            if not needs:            # a real token: scored now, whatever sampling brings
                del reqs[st.rid]
                self._release(st)    # (its tracked rows, if any, add to a free slot)
        resets = self.sums.take_resets()
        up = self.xfer.up(resets, lrows, scored_row, scored_slot, scored_count, hidden_rows,
                          draft_of, draft_row, draft_at)
        reset_d, lrows_d, *scored_d = up
        if resets:
            self.sums.zero(reset_d)
        if len(lrows):
            from vllm_rl.kernels import logsumexp_entropy

            # vLLM's sampler may work in place on the logits (temperature, penalties,
            # masks): the tracked rows are kept as they are now (their dtype), for the
            # sampled tokens' gather after it
            plan.src = logits.index_select(0, lrows_d)
            plan.lse, plan.ent = logsumexp_entropy(plan.src)
        if draft_at:
            scored_d[-1] = meta.draft_token_ids.index_select(
                0, scored_d[-1].to(meta.draft_token_ids.device)).long()
        if len(found):
            self._score(plan, state, *scored_d)
        return plan

    def _score(self, plan: Plan, state, scored_row, scored_slot, scored_count, hidden_rows,
               draft_of, draft_row, draft_tok) -> None:
        """Score the rows in one call (with each one's trace features: the tokens before
        this step, plus this step's drafts up to the scored one); the score and features
        ([R, 4]) and the hidden rows asked for start to the host without blocking."""
        head = plan.head
        # the trace accumulators: Σ log p, min log p, Σ entropy of the tokens so far
        logp_sum, logp_min, ent_sum = self.sums.acc.index_select(1, scored_slot).unbind(0)
        if draft_of.numel():
            lp = token_logprob(plan, draft_row, draft_tok)
            logp_sum = logp_sum.index_add(0, draft_of, lp)
            ent_sum = ent_sum.index_add(0, draft_of, plan.ent.index_select(0, draft_row))
            logp_min = logp_min.scatter_reduce(0, draft_of, lp, "amin")
        n = scored_count.float()
        mean = 1.0 / n.clamp_min(1.0)
        feats = torch.stack((logp_sum * mean, logp_min, ent_sum * mean), 1) \
            .masked_fill((n == 0).unsqueeze(1), 0.0)
        from vllm_rl.kernels import score_rows

        b1 = head.b1
        if head.w1f is not None:
            b1 = head.b1 + feats @ head.w1f.t()          # [R, D]: W1f f folded into b1
        scores = score_rows(state.hidden_states, scored_row, head.w1, b1, head.w2, head.b2,
                            head.activation)
        plan.values = self.xfer.down(torch.cat((scores.unsqueeze(1), feats), 1))
        if hidden_rows.numel():
            plan.hidden = self.xfer.down(state.hidden_states.index_select(0, hidden_rows))
        plan.ready = self.xfer.ready()

    def finish(self, plan: Plan, out) -> None:
        """After sampling: add this step's kept tokens to the traces (on the device), and
        decide the scored rows once vLLM has synchronised: here with synchronous output,
        in the output's ``get_output`` with async output.  Its host time goes to the
        step trace (:data:`vllm_rl.cost.host.WORKER`)."""
        t0 = perf_counter_ns()
        try:
            with torch.inference_mode():
                self._finish(plan, out)
        finally:
            HOST.scorer_ns += perf_counter_ns() - t0

    def _finish(self, plan: Plan, out) -> None:
        mro = getattr(out, "_model_runner_output", out)
        if out is mro:           # synchronous: vLLM's _bookkeeping_sync has waited
            if plan.tracked:
                self.sums.add_sampled(plan, mro.sampled_token_ids, self.xfer)
            if plan.rows:
                self._decide(plan, mro)
            self._settle()
        else:
            if plan.tracked:
                self.sums.add_sampled_async(plan, out, self.xfer)
            if plan.rows:
                self._defer(plan, out)
        plan.src = plan.lse = plan.ent = None
        plan.t_slot = plan.t_index = plan.t_k = plan.t_count = EMPTY

    def _defer(self, plan: Plan, out) -> None:
        """Async output: decide in its ``get_output``, after it has waited for its copy
        event (recorded after this step's copies)."""
        def decide(mro) -> None:
            t0 = perf_counter_ns()
            try:
                self._decide(plan, mro)
            finally:
                HOST.scorer_ns += perf_counter_ns() - t0

        attach(out).defer(decide)

    def _decide(self, plan: Plan, mro) -> None:
        """After vLLM's sync point: keep the rows whose token is the sample's own, decide
        (Eq. 1-2, the coin), keep the hidden states asked for, attach the verdicts."""
        self.xfer.wait(plan.ready)               # complete already: vLLM has waited
        values = plan.values.tolist()
        sampled = mro.sampled_token_ids
        index = mro.req_id_to_index or {}
        head = plan.head
        cal = head.calibration
        verdicts = {}
        for j, c in enumerate(plan.rows):
            if c.needs:
                i = index.get(c.rid)
                if i is None or not sampled or i >= len(sampled) \
                        or len(sampled[i]) - 1 < c.needs:
                    continue          # that draft was rejected: the real token comes next step
                self._settled.append(c.rid)
            score, *trace = values[j]
            coin = 0.0 if cal is None else rule.prune_coin(
                c.owner.sampling_params.seed, c.owner.prompt_token_ids, c.rid)
            v = rule.decide(score, cal, c.flags, coin, c.share)
            kept = c.hidden >= 0
            if kept:
                self.hidden_store.put(c.rid, plan.hidden[c.hidden].to(torch.float32,
                                                                      copy=True).numpy())
            self.scored_total += 1
            self.scored_at_draft += c.needs > 0
            self.pruned_total += bool(v.pruned)
            verdicts[c.rid] = rule.ArrolVerdict(v.score, v.q, v.p, v.pruned, head.version,
                                                kept, tuple(trace),
                                                cal.auc if cal is not None else None)
        if verdicts:
            attach(mro).verdicts.update(verdicts)
