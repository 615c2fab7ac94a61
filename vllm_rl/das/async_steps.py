"""What crosses between the DAS drafter and vLLM's model runner under async scheduling
(:mod:`vllm_rl.das.async_drafts` runs the loop): an async step in flight
(:class:`InFlight`: its sampled ids on their way to the host, its rows as the runner had
them), the drafts planned for the next step (:class:`DraftPlan`), the copies each way,
the drafts handed to vLLM where its async path reads them (:func:`upload`), and the
step's scheduler output with each request cut to its real draft (:func:`cut_to_drafts`).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from functools import cached_property
from itertools import repeat
from typing import Any

import numpy as np

from vllm_rl.das.state import StepRows


@dataclass
class InFlight:
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
    fed: bool = False            # its tokens were taken in
    device: Any = None           # its sampled ids on the device
    hyps: Any = None             # lookahead: the hypotheses of its outcome (.hypotheses)
    matched: Any = None          # per row, the hypothesis it bore out (-1: none), once fed
    row_slots: Any = None        # its rows' slots as first mapped (RequestBook._rows)
    row_epochs: Any = None       # and those slots' epochs then

    @cached_property
    def ids(self) -> set:
        """Its request ids as a set."""
        return set(self.req_ids)


@dataclass
class DraftPlan:
    """The drafts to make for the rows of the last step (:meth:`vllm_rl.das.async_drafts.AsyncDrafts._plan`):
    lengths in ``step.max_tokens``, contexts, the phase cap's cut, and under the
    lookahead (``extra`` = 1: that step's outcome is hypothesised) the drafts ``d`` each
    row verifies in that step, ``k`` of them sound."""

    step: StepRows
    contexts: np.ndarray
    context_len: np.ndarray
    phase: Any
    extra: int
    k: Any
    d: Any


def to_host(t):
    """Start ``t``'s copy to the host: (host tensor, event to wait on, or None)."""
    import torch

    if t.device.type == "cpu":
        return t, None
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t, non_blocking=True)
    event = torch.cuda.Event()
    event.record()
    return host, event


def padded(drafts: np.ndarray, n: int, k_max: int) -> np.ndarray:
    """``drafts`` as ``[n, k_max]`` int32 (zero padded)."""
    out = np.zeros((n, k_max), dtype=np.int32)
    w = min(k_max, drafts.shape[1]) if drafts.ndim == 2 else 0
    if w:
        out[:, :w] = drafts[:n, :w]
    return out


def on_device(runner, arr: np.ndarray):
    """``arr`` on the runner's device (a non-blocking copy from pinned memory)."""
    import torch

    t = torch.from_numpy(np.ascontiguousarray(arr))
    if runner.device.type != "cpu":
        t = t.pin_memory().to(runner.device, non_blocking=True)
    return t


def upload(runner, t, k_max: int, sched) -> None:
    """Put the drafts (``[rows, k_max]`` int32 on the device) where vLLM's async path
    scatters them into the step's input ids (``_draft_token_ids``, rows of the previous
    step, ``prev_num_spec_tokens`` wide)."""
    runner._draft_token_ids = t
    runner.prev_num_spec_tokens = k_max
    if runner._draft_token_req_ids is not None:      # penalties read the drafts on the host
        runner._copy_draft_token_ids_to_cpu(sched)


def verified_drafts(verifying, req_ids, k_max: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row of ``req_ids``: how many drafts it verifies in the step on the device,
    and those drafts (``[rows, k_max]``), from what :meth:`vllm_rl.das.async_drafts.AsyncDrafts.before_step`
    uploaded for that step (``(rows, drafts, counts, step before)``; None: no drafts).
    Hypotheses' drafts (``[rows, H, k_max]``) are the ones the step before bore out
    (:attr:`InFlight.matched`); a row that bore out none verifies no sound draft."""
    n = len(req_ids)
    d = np.zeros((n, k_max), dtype=np.int32)
    if verifying is None:
        return np.zeros(n, dtype=np.int64), d
    rows, drafts, counts, before = verifying
    k = np.fromiter(map(counts.get, req_ids, repeat(0)), dtype=np.int64, count=n)
    idx = np.fromiter(map(rows.get, req_ids, repeat(-1)), dtype=np.int64, count=n)
    if drafts.ndim == 3:
        m = before.matched if before.matched is not None else np.full(len(drafts), -1)
        k = np.where(m[np.maximum(idx, 0)] >= 0, k, 0)
        drafts = drafts[np.arange(len(drafts)), np.maximum(m, 0)]
    ok = np.flatnonzero((idx >= 0) & (k > 0))
    w = min(k_max, drafts.shape[1]) if drafts.ndim == 2 else 0
    if len(ok) and w:
        d[ok, :w] = drafts[idx[ok], :w]
    return np.minimum(k, w), d


def cut_to_drafts(sched, rows: dict, lengths: list):
    """The scheduler output as the worker runs it: each request scheduled on its draft
    only (``lengths[rows[rid]]``, at most the scheduler's placeholders; none for a
    request not in ``rows``).  Returns it (a copy where any request was cut: the
    scheduler's own object is left as it scheduled), the requests cut with the
    scheduler's count, and each request's draft count.  Hot path: one pass over the
    step's speculative requests."""
    spec = sched.scheduled_spec_decode_tokens
    get = rows.get
    counts, cut, kept = {}, {}, {}
    num = total = None
    for rid, toks in spec.items():
        i = get(rid)
        m = len(toks)
        k = 0 if i is None else min(lengths[i], m)
        if k:
            counts[rid] = k
            kept[rid] = toks if k == m else toks[:k]
        if k < m:
            if num is None:
                num, total = dict(sched.num_scheduled_tokens), sched.total_num_scheduled_tokens
            cut[rid] = m
            num[rid] -= m - k
            total -= m - k
    if not cut:
        return sched, cut, counts
    out = copy.copy(sched)
    out.scheduled_spec_decode_tokens = kept
    out.num_scheduled_tokens = num
    out.total_num_scheduled_tokens = total
    return out, cut, counts


__all__ = ["DraftPlan", "InFlight", "cut_to_drafts", "on_device", "padded", "to_host",
           "upload", "verified_drafts"]
