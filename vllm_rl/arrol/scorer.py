"""The quality head on the worker: score each sample in the step that computes its
``l_detect``-th token, and decide its survival (Alg. 1 l.15-19; App. A.4).

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
its new tokens (before the sampler divides them by the temperature in place) and adds
each kept token's log-probability and its distribution's entropy to the sample's running
sums; at ``l_detect`` the head may read their mean / minimum / mean entropy
(:data:`~vllm_rl.arrol.rule.TRACE_FEATURES`) beside the hidden state, and the
verdict carries them to the record.  A token counts once it is the sample's own: a draft
only if accepted.  With vLLM's async output the sampled ids stay on the device; their
log-probabilities are gathered there, copied without blocking and added at the next step.

What: every scored row of a step goes through the head in one call
(:func:`vllm_rl.kernels.score_rows`: Triton on CUDA, PyTorch on the CPU); with the
calibration pushed by the trainer the score becomes q (Eq. 1 and Bayes) and p (Eq. 2),
and the sample's coin (its seed and prompt, :func:`vllm_rl.arrol.rule.prune_coin`) prunes
it with probability 1 - p.  Without a calibration (cold start) it is scored, not pruned.

Where the verdicts go: ``ModelRunnerOutput.vllm_rl_arrol`` ``{request id: verdict
tuple}``, read by the scheduler in the same step (:mod:`vllm_rl.engine.scheduler`).
The output object crosses vLLM's multiprocess executor by pickling, attribute included.
"""
from __future__ import annotations

import base64
import json
import logging
import math
from dataclasses import dataclass, field, replace
from time import perf_counter_ns
from typing import Any

import torch

from vllm_rl.arrol.config import ArrolConfig
from vllm_rl.cost.host import WORKER as HOST     # the scorer's host time, for the trace
from vllm_rl.arrol import rule
from vllm_rl.flags import ArrolFlags, read_or_warn

OUTPUT_ATTR = "vllm_rl_arrol"
logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Head:
    """One immutable head + calibration; replaced whole by an update, so a step never
    sees half of one (``version`` names it in every record)."""

    w1: torch.Tensor
    b1: torch.Tensor
    w2: torch.Tensor
    b2: torch.Tensor
    activation: str
    calibration: rule.Calibration | None
    version: int
    w1f: torch.Tensor | None = None      # [D, F]: a head that reads the trace features


@dataclass
class Candidate:
    request_id: str
    owner: Any                 # the runner's CachedRequestState (request ids can be reused)
    flags: ArrolFlags
    needs_accept: int          # 0: a real token; j > 0: the j-th draft, real if accepted
    score: float
    hidden: torch.Tensor | None
    coin: float
    trace: tuple[float, ...] | None = None


@dataclass
class Trace:
    """A sample's running trace sums over its first ``l_detect`` tokens."""

    owner: Any
    n: int = 0
    sum_lp: float = 0.0
    min_lp: float = math.inf
    sum_ent: float = 0.0

    def add(self, lp: float, ent: float) -> None:
        self.n += 1
        self.sum_lp += lp
        self.min_lp = min(self.min_lp, lp)
        self.sum_ent += ent

    def features(self, extra: list[tuple[float, float]] = ()) -> tuple[float, ...]:
        """TRACE_FEATURES with ``extra`` (lp, entropy) pairs appended; zeros if empty."""
        n, s, m, e = self.n, self.sum_lp, self.min_lp, self.sum_ent
        for lp, ent in extra:
            n, s, m, e = n + 1, s + lp, min(m, lp), e + ent
        return (s / n, m, e / n) if n else (0.0, 0.0, 0.0)


@dataclass
class Tracked:
    """A sample whose tokens of this step feed its trace: its batch index, its first
    logits row in ``Plan.logprobs`` and how many rows it has there."""

    index: int
    request_id: str
    trace: Trace
    row: int
    rows: int
    limit: int                 # l_detect: tokens past it are not counted


@dataclass
class Plan:
    head: Head
    rows: list[Candidate]
    tracked: list[Tracked] = field(default_factory=list)
    logprobs: torch.Tensor | None = None     # [rows, V] log-softmax of the tracked rows
    entropy: torch.Tensor | None = None      # [rows]


def encode_hidden(h: torch.Tensor) -> str:
    """Base64 of the float32 little-endian vector (how a hidden state travels)."""
    return base64.b64encode(h.detach().float().cpu().contiguous().numpy().astype("<f4")
                            .tobytes()).decode("ascii")


def _tensor(x: Any, shape: tuple[int, ...], name: str, device, dtype=torch.float32):
    t = torch.as_tensor(x, dtype=dtype)
    if tuple(t.shape) != shape:
        raise ValueError(f"ARRoL head '{name}': shape {tuple(t.shape)}, expected {shape}")
    if not torch.isfinite(t).all():
        raise ValueError(f"ARRoL head '{name}': non-finite values")
    return t.to(device)


def load_head_state(head: Any) -> dict:
    """A head state from a dict or the path of a JSON file holding one."""
    if isinstance(head, (str, bytes)) or hasattr(head, "__fspath__"):
        with open(head) as f:
            return json.load(f)
    if not isinstance(head, dict):
        raise ValueError("ARRoL head: a state dict (QualityHead.export) or a JSON path")
    return head


def _calibration(value: Any) -> rule.Calibration | None:
    """A :class:`Calibration` from itself, its dict, or None."""
    if value is None or isinstance(value, rule.Calibration):
        return value
    return rule.Calibration.from_dict(value)


def scorer_of(runner) -> "HeadScorer | None":
    """The runner's scorer, made on first use on an ARRoL engine (its additional_config
    names the head); None, remembered, on any other engine."""
    if "vllm_rl_arrol" not in runner.__dict__:
        cfg = ArrolConfig.from_vllm_config(runner.vllm_config)
        runner.vllm_rl_arrol = None if cfg is None else HeadScorer(
            cfg, runner.model_config.get_hidden_size(), runner.device)
    return runner.vllm_rl_arrol


class HeadScorer:
    """Per model runner: the current :class:`Head` and which requests were scored."""

    def __init__(self, cfg: ArrolConfig, hidden_size: int, device) -> None:
        self.hidden_size = hidden_size
        self.device = device
        self.cfg = cfg
        self._scored: dict[str, Any] = {}          # request id -> owner it was scored as
        self._flags: dict[str, tuple[Any, ArrolFlags | None]] = {}
        self._traces: dict[str, Trace] = {}        # not yet scored: running trace sums
        self._pending: list[tuple] = []            # async output: trace terms in flight
        self.scored_total = 0
        self.pruned_total = 0
        self.scored_at_draft = 0            # scored at an accepted draft position (DAS)
        if cfg.head is not None:
            state = load_head_state(cfg.head)
        else:
            from vllm_rl.arrol.head import QualityHead

            torch.manual_seed(cfg.seed)
            state = QualityHead(hidden_size, cfg.width, cfg.activation).export(0)
        self.head = replace(self._build(state, int(state.get("version", 0))),
                            calibration=_calibration(cfg.calibration))

    # ------------------------------------------------------------------ updates
    def _build(self, state: dict, version: int) -> Head:
        """Checked weights on the runner's device, no calibration."""
        from vllm_rl.arrol.head import check_head_state

        check_head_state(state, hidden_size=self.hidden_size)
        width = int(state["width"])
        w1f = None
        if state.get("w1f") is not None:
            w1f = _tensor(state["w1f"], (width, len(rule.TRACE_FEATURES)), "w1f", self.device)
        return Head(
            w1=_tensor(state["w1"], (width, self.hidden_size), "w1", self.device),
            b1=_tensor(state["b1"], (width,), "b1", self.device),
            w2=_tensor(state["w2"], (width,), "w2", self.device),
            b2=_tensor(state["b2"], (), "b2", self.device),
            activation=state["activation"], calibration=None, version=version, w1f=w1f)

    def update(self, head: Any = None, calibration: Any = None, cold_start: bool = False,
               version: int | None = None) -> int:
        """Replace the head and/or the calibration between steps; returns the version.

        ``head=None`` keeps the weights, ``calibration=None`` keeps the calibration,
        ``cold_start=True`` drops it (score only).  Everything is checked before the
        swap: a bad update raises and leaves the current head serving.
        """
        cur = self.head
        if cold_start and calibration is not None:
            raise ValueError("arrol_update: cold_start=True and a calibration together")
        new_version = cur.version + 1 if version is None else int(version)
        weights = cur if head is None else self._build(load_head_state(head), new_version)
        cal = None if cold_start else (
            cur.calibration if calibration is None else _calibration(calibration))
        self.head = replace(weights, calibration=cal, version=new_version)
        return new_version

    def info(self) -> dict[str, Any]:
        h = self.head
        return {"version": h.version, "hidden_size": self.hidden_size,
                "width": int(h.w1.shape[0]), "activation": h.activation,
                "features": list(rule.TRACE_FEATURES) if h.w1f is not None else [],
                "calibrated": h.calibration is not None,
                "calibration": h.calibration.to_dict() if h.calibration else None,
                "scored": self.scored_total, "pruned": self.pruned_total,
                "scored_at_draft": self.scored_at_draft}

    # ------------------------------------------------------------------ per step
    def _flags_of(self, runner, rid: str) -> tuple[Any, ArrolFlags | None]:
        owner = runner.requests.get(rid)
        cached = self._flags.get(rid)
        if cached is not None and cached[0] is owner:
            return cached
        flags = None
        extra = getattr(getattr(owner, "sampling_params", None), "extra_args", None)
        # once per request: the canonical form the front end wrote; flags that do not
        # read (the front end was bypassed) are logged once and the sample is not scored
        parsed = read_or_warn(extra, rid, logger) if extra else None
        if parsed is not None and parsed.arrol is not None:
            flags, g = parsed.arrol, parsed.group
            if parsed.darts is not None and g is not None:
                # composition rule: in a DARTS group κ applies to the redundant M' − M
                flags = replace(flags, kappa=rule.composed_kappa(flags.kappa, g.size,
                                                                 g.redundant))
        self._flags[rid] = (owner, flags)
        return owner, flags

    def plan(self, runner, state) -> Plan | None:
        """Before sampling: the rows whose ``l_detect``-th token this step computes,
        scored in one call, and the log-softmax of the logits rows whose tokens feed the
        traces of samples not yet scored.  Acceptance of draft rows is settled in
        :meth:`finish`.  Its host time goes to the step trace (:data:`vllm_rl.cost.host.WORKER`)."""
        t0 = perf_counter_ns()
        try:
            return self._plan(runner, state)
        finally:
            HOST.scorer_ns += perf_counter_ns() - t0

    def _plan(self, runner, state) -> Plan | None:
        self._drain_pending()
        so = state.scheduler_output
        batch = runner.input_batch
        n_reqs = batch.num_reqs
        if len(self._flags) > 4 * n_reqs + 256:
            self._forget(runner)
        spec = so.scheduled_spec_decode_tokens or {}
        meta = state.spec_decode_metadata
        per_req = [1] * n_reqs if meta is None else [d + 1 for d in meta.num_draft_tokens]
        found: list[tuple[int, str, Any, ArrolFlags, int, Trace, int]] = []
        tracked: list[Tracked] = []
        first_row, lrows = 0, []
        for i, rid in enumerate(batch.req_ids[:n_reqs]):
            start, first_row = first_row, first_row + (per_req[i] if i < len(per_req) else 1)
            owner, flags = self._flags_of(runner, rid)
            if flags is None or self._scored.get(rid) is owner:
                continue
            trace = self._traces.get(rid)
            if trace is None or trace.owner is not owner:
                trace = self._traces[rid] = Trace(owner)
            k = -1                       # its first row in the concatenated logprobs
            if trace.n < flags.l_detect and state.logits is not None:
                k = len(lrows)
                rows = per_req[i] if i < len(per_req) else 1
                lrows.extend(range(start, start + rows))
                tracked.append(Tracked(i, rid, trace, k, rows, flags.l_detect))
            n = so.num_scheduled_tokens.get(rid, 0)
            off = int(batch.num_prompt_tokens[i]) + flags.l_detect - 1 \
                - int(batch.num_computed_tokens_cpu[i])
            if not 0 <= off < n:
                continue
            real = n - len(spec.get(rid, ()))
            found.append((int(runner.query_start_loc.np[i]) + off, rid, owner, flags,
                          max(0, off - real + 1), trace, k))
        if not found and not tracked:
            return None
        logprobs = entropy = None
        if lrows:
            idx = torch.tensor(lrows, dtype=torch.int64, device=state.logits.device)
            logprobs = torch.log_softmax(state.logits.index_select(0, idx).float(), dim=-1)
            entropy = -(logprobs.exp() * logprobs).sum(-1)
        plan = Plan(self.head, [], tracked, logprobs, entropy)
        if found:
            plan.rows = self._score(plan, state, spec, found)
        return plan

    def _score(self, plan: Plan, state, spec, found) -> list[Candidate]:
        """Score the candidate rows in one call (with each one's trace features: the
        tokens before this step, plus this step's drafts up to the scored one)."""
        head = plan.head
        traces = []
        for _, rid, _, _, needs, trace, k in found:
            extra: list[tuple[float, float]] = []
            if needs and k >= 0:
                drafts = list(spec.get(rid, ()))[:needs]
                rows = list(range(k, k + len(drafts)))
                lps = plan.logprobs[rows, torch.tensor(drafts).clamp_min(0).to(
                    plan.logprobs.device)].tolist()
                extra = list(zip(lps, plan.entropy[rows].tolist()))
            traces.append(trace.features(extra))
        from vllm_rl.kernels import score_rows

        rows = torch.tensor([f[0] for f in found], dtype=torch.int64,
                            device=state.hidden_states.device)
        b1 = head.b1
        if head.w1f is not None:
            feats = torch.tensor(traces, dtype=torch.float32, device=head.w1f.device)
            b1 = head.b1 + feats @ head.w1f.t()          # [R, D]: W1f f folded into b1
        scores = score_rows(state.hidden_states, rows, head.w1, b1, head.w2, head.b2,
                            head.activation).tolist()
        want = [j for j, f in enumerate(found) if f[3].return_hidden]
        hidden = {}
        if want:
            picked = state.hidden_states[rows[want]].float().cpu()
            hidden = {j: picked[k] for k, j in enumerate(want)}
        out = []
        for j, (_, rid, owner, flags, needs, _, _) in enumerate(found):
            params = owner.sampling_params
            coin = rule.prune_coin(params.seed, owner.prompt_token_ids, rid)
            out.append(Candidate(rid, owner, flags, needs, float(scores[j]), hidden.get(j),
                                 coin, traces[j]))
        return out

    def finish(self, plan: Plan, out) -> None:
        """After sampling: add this step's kept tokens to the traces, keep the candidate
        rows whose token is the sample's own, decide, and attach the verdicts to the
        step's output.  Its host time goes to the step trace (:data:`vllm_rl.cost.host.WORKER`)."""
        t0 = perf_counter_ns()
        try:
            self._finish(plan, out)
        finally:
            HOST.scorer_ns += perf_counter_ns() - t0

    def _finish(self, plan: Plan, out) -> None:
        mro = getattr(out, "_model_runner_output", out)
        sampled = getattr(mro, "sampled_token_ids", None)
        index = getattr(mro, "req_id_to_index", None) or {}
        if plan.tracked:
            if out is mro:
                self._add_tokens(plan, sampled, index)
            else:
                self._add_tokens_async(plan, out)
        verdicts = {}
        for c in plan.rows:
            if c.needs_accept:
                i = index.get(c.request_id)
                if out is not mro or i is None or not sampled or i >= len(sampled):
                    continue          # async output: acceptance unknown here (not a DAS engine)
                if len(sampled[i]) - 1 < c.needs_accept:
                    continue          # that draft was rejected: the real token comes next step
            v = rule.decide(c.score, plan.head.calibration, c.flags, c.coin)
            self._scored[c.request_id] = c.owner
            self._traces.pop(c.request_id, None)
            self.scored_total += 1
            self.scored_at_draft += c.needs_accept > 0
            self.pruned_total += bool(v.pruned)
            verdicts[c.request_id] = rule.ArrolVerdict(
                v.score, v.q, v.p, v.pruned, plan.head.version,
                encode_hidden(c.hidden) if c.hidden is not None else None, c.trace)
        if verdicts:
            setattr(mro, OUTPUT_ATTR, verdicts)

    def _add_tokens(self, plan: Plan, sampled, index) -> None:
        """This step's kept tokens of each tracked sample: token k came from its k-th
        logits row (a draft accepted, or the bonus / plain sampled token)."""
        rows, toks, owners = [], [], []
        for t in plan.tracked:
            i = index.get(t.request_id)
            if i is None or not sampled or i >= len(sampled):
                continue
            room = t.limit - t.trace.n
            for k, tok in enumerate(list(sampled[i])[:min(t.rows, max(room, 0))]):
                rows.append(t.row + k)
                toks.append(int(tok))
                owners.append(t.trace)
        if rows:
            r = torch.tensor(rows, device=plan.logprobs.device)
            lps = plan.logprobs[r, torch.tensor(toks, device=r.device)].tolist()
            for trace, lp, ent in zip(owners, lps, plan.entropy[r].tolist()):
                trace.add(lp, ent)

    def _add_tokens_async(self, plan: Plan, out) -> None:
        """Async output (no drafts): the sampled ids are a device tensor; gather their
        log-probabilities there and copy them without blocking (added next step)."""
        ids = getattr(out, "_sampled_token_ids", None)
        if ids is None:
            return
        bad = set(getattr(out, "_invalid_req_indices", ()) or ())
        keep = [t for t in plan.tracked if t.index not in bad and t.trace.n < t.limit]
        if not keep:
            return
        dev = plan.logprobs.device
        r = torch.tensor([t.row for t in keep], device=dev)
        tok = ids[torch.tensor([t.index for t in keep], device=ids.device), 0].to(dev)
        lp = plan.logprobs[r, tok.clamp_min(0).long()].to("cpu", non_blocking=True)
        ent = plan.entropy[r].to("cpu", non_blocking=True)
        event = None
        if dev.type == "cuda":
            event = torch.cuda.Event()
            event.record()
        self._pending.append((event, lp, ent, [t.trace for t in keep]))

    def _drain_pending(self) -> None:
        pending, self._pending = self._pending, []
        for event, lp, ent, traces in pending:
            if event is not None:
                event.synchronize()
            for trace, a, b in zip(traces, lp.tolist(), ent.tolist()):
                trace.add(a, b)

    def _forget(self, runner) -> None:
        live = runner.requests
        self._flags = {r: v for r, v in self._flags.items() if r in live}
        self._scored = {r: v for r, v in self._scored.items() if r in live}
        self._traces = {r: v for r, v in self._traces.items() if r in live}
