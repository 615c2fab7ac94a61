"""DAS's draft caps by batch size: where drafting pays on the step-cost curve (Sec. 4.2.1).

A forward pass costs t_fwd = c_base + c_tok n_toks (Eq. 1): drafting trades fewer passes for
more tokens per pass, and on a large batch the trade stops paying (:func:`break_even_batch`,
:func:`batch_cap`).  With a measured step-cost model in place of Eq. 1: :func:`cost_cap`
(one draft length per step) and :func:`phase_budgets` (phase-aware: per request, the lengths
that make the step cheapest per generated token; off or short in the bulk of a rollout step,
the full budget in its tail).  Pure Python.
"""
from __future__ import annotations

import heapq
import math
import numbers
from collections.abc import Callable, Sequence
from vllm_rl.checks import check_int as _check_int
from vllm_rl.checks import check_real as _check_real
from vllm_rl.checks import check_same_length as _check_same_length
from vllm_rl.checks import check_unit as _check_unit


def batch_cap(batch_size: int, full_at: float, off_at: float) -> float:
    """The share of the draft budget kept at this batch size: 1 up to ``full_at``, 0 from
    ``off_at``, linear in between.

    Eq. 1-2: a pass costs c_base + c_tok n_toks.  On a small batch c_base dominates and
    drafting, which cuts passes (N_fwd), pays; on a large batch c_base is amortised over
    many requests while verification adds c_tok per draft token to every pass, so the
    same drafts cost more than the passes they save (see :func:`break_even_batch`).
    """
    batch_size = _check_int("batch_size", batch_size, 0)
    full_at = _check_real("full_at", full_at, lo=0.0)
    off_at = _check_real("off_at", off_at, lo=0.0)
    if off_at < full_at:
        raise ValueError(f"off_at ({off_at}) must be >= full_at ({full_at})")
    if batch_size <= full_at:
        return 1.0
    if batch_size >= off_at:
        return 0.0
    return (off_at - batch_size) / (off_at - full_at)


def chain_accepted(q: float, k: int) -> float:
    """S(q, k) = q + q² + … + q^k: the accepted tokens of a k-token draft whose tokens are
    each accepted with probability q until the first rejection."""
    q = _check_unit("q", q)
    k = _check_int("k", k, 0)
    if q >= 1.0:
        return float(k)
    return q * (1.0 - q ** k) / (1.0 - q)


def cost_cap(step_ms: Callable[[int], float], batch: int, drafting: int, q: float,
             k_max: int) -> int:
    """The draft length per request that makes a step cheapest per generated token.

    A step of ``batch`` sequences, ``drafting`` of which verify ``k`` draft tokens, costs
    ``step_ms(k)`` (the engine's step-cost model: Eq. 1's c_base + c_tok n_toks measured
    or tabulated at this batch and context) and yields ``batch + drafting · S(q, k)``
    tokens (:func:`chain_accepted`).  Returns the k in [0, k_max] minimising the cost per
    token (ties: the smaller k).  On a GPU a decode step is memory-bound: widening a
    small batch is nearly free and k = k_max; on a large batch verification costs more
    than its accepted tokens save and k = 0.  This is the batch cap of Sec. 4.2.1
    derived from the cost model instead of fixed thresholds (:func:`batch_cap`).
    """
    batch = _check_int("batch", batch, 0)
    drafting = _check_int("drafting", drafting, 0)
    k_max = _check_int("k_max", k_max, 0)
    if batch == 0 or drafting == 0 or k_max == 0:
        return 0
    best_k, best = 0, step_ms(0) / batch
    for k in range(1, k_max + 1):
        per_token = step_ms(k) / (batch + drafting * chain_accepted(q, k))
        if per_token < best * (1.0 - 1e-9):
            best_k, best = k, per_token
    return best_k


def _width_curve(step_ms: Callable[[int], float], batch: int, k_top: int,
                 slopes: bool = False):
    """D ↦ the step's time when its ``batch`` sequences verify D drafts in all: ``step_ms``
    at the integer mean draft counts 0 … ``k_top`` (made non-decreasing), linear between.
    With ``slopes``, also each segment's smallest slope from it to the last (ms per
    draft), for :func:`phase_budgets`' stopping bound."""
    knots, top = [], 0.0
    for k in range(k_top + 1):
        v = step_ms(k)
        if (isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v)
                or v < 0):
            raise ValueError(f"step_ms({k}) must be a finite number >= 0, got {v!r}")
        top = max(top, float(v))
        knots.append(top)

    def cost(d: float) -> float:
        if not k_top:
            return knots[0]
        x = d / batch
        k = min(int(x), k_top - 1)
        return knots[k] + (x - k) * (knots[k + 1] - knots[k])

    if not slopes:
        return cost
    ahead = [(knots[k + 1] - knots[k]) / batch for k in range(k_top)]
    for k in range(k_top - 2, -1, -1):
        ahead[k] = min(ahead[k], ahead[k + 1])
    return cost, ahead


def _check_rows(q: Sequence[float], caps: Sequence[int], name: str = "caps"
                ) -> tuple[list[float], list[int]]:
    """``q`` in [0, 1] and ``caps`` ints >= 0, one per drafting sequence (a fast path for
    the plain floats and ints the engine passes; else each entry checked by name)."""
    qs, cs = list(q), list(caps)
    if not (all(type(v) is float and 0.0 <= v <= 1.0 for v in qs)
            and all(type(c) is int and c >= 0 for c in cs)):
        qs = [_check_unit(f"q[{i}]", v) for i, v in enumerate(qs)]
        cs = [_check_int(f"{name}[{i}]", v, 0) for i, v in enumerate(cs)]
    return qs, cs


def phase_ms_per_token(step_ms: Callable[[int], float], batch: int, q: Sequence[float],
                       k: Sequence[int]) -> float:
    """Expected time per generated token of a step in which the drafting sequences verify
    ``k[i]`` drafts each, accepted with per-token probability ``q[i]`` until the first
    rejection: step_ms at the total draft count (as :func:`phase_budgets` reads it) over
    ``batch`` + Σ_i S(q_i, k_i) (every sequence samples one token, :func:`chain_accepted`
    for the drafts).  The quantity :func:`phase_budgets` minimises."""
    batch = _check_int("batch", batch, 1)
    n = _check_same_length(q=q, k=k)
    qs, ks = _check_rows(q, k, "k")
    if n > batch:
        raise ValueError(f"q has {n} entries, more than the batch's {batch} sequences")
    cost = _width_curve(step_ms, batch, max(ks, default=0))
    tokens = batch + math.fsum(chain_accepted(a, b) for a, b in zip(qs, ks))
    return cost(sum(ks)) / tokens


def phase_budgets(step_ms: Callable[[int], float], batch: int, q: Sequence[float],
                  caps: Sequence[int]) -> list[int]:
    """Phase-aware draft lengths: per drafting sequence, the k_i in [0, caps[i]] that make
    the next step cheapest per generated token on the step-cost model.

    DAS's cost model (Sec. 4.2.1) prices a pass as t_fwd = c_base + c_tok n_toks (Eq. 1)
    and a rollout as the sum of its passes (Eq. 2); here the pass is priced by the
    engine's step-cost model instead (``step_ms(k)``: the time of the step when each of
    its ``batch`` sequences verifies k drafts, e.g. ``StepCost.uniform_ms(batch, 1 + k,
    context)``; read at k = 0 … max(caps), linear in between, so a step verifying D drafts
    in all costs step_ms at D / batch: the mean-width reading of
    :meth:`vllm_rl.cost.StepCost.step_ms`).  A draft of k tokens whose tokens are each
    accepted with probability q until the first rejection yields S(q, k) = q + … + q^k
    accepted tokens (:func:`chain_accepted`; q is Eq. 3's capacity k of the request,
    :func:`estimate_k`).  The step yields ``batch`` + Σ_i S(q_i, k_i) tokens, and this
    returns the k minimising

        step_ms(Σ_i k_i / batch) / (batch + Σ_i S(q_i, k_i))

    (ties: fewer drafts).  On a GPU that is *phase-aware* drafting: in the bulk of a
    rollout step (hundreds of sequences, a compute-bound step, where widening by 8
    drafts costs several plain steps) only drafts with a high acceptance pay, and few
    of them; in the tail (a handful of sequences, a memory-bound step, widening nearly
    free) every draft pays and each request drafts its full budget, which is where
    Eq. 4 says the batch's time goes (N_fwd is set by the longest requests).

    Exact: for a total of D drafts, the best split takes the D largest marginal gains
    q_i^j (j-th draft of request i; S is concave in k, so they form a prefix per request);
    the minimum over D is found by one scan of those gains in decreasing order, grouped by
    equal (q_i, caps_i) (the ratio is monotone between two evaluation points, so only the
    ends of a run of equal gains and the knots of the cost curve are evaluated), drawn
    lazily from a heap and stopped once no remaining gain can beat the best ratio: past
    D drafts the cost grows at least at the curve's smallest slope ahead, the tokens at
    most by the current gain per draft (so in the bulk only drafts whose acceptance
    beats their marginal price are looked at).
    ``q`` and ``caps`` list the drafting sequences (at most ``batch`` of them); a cap or
    acceptance of 0 gives 0.
    """
    batch = _check_int("batch", batch, 0)
    n = _check_same_length(q=q, caps=caps)
    qs, cs = _check_rows(q, caps)
    out = [0] * n
    if n > batch:
        raise ValueError(f"q has {n} entries, more than the batch's {batch} sequences")
    groups: dict[tuple[float, int], list[int]] = {}
    for i, (qv, cap) in enumerate(zip(qs, cs)):
        if qv > 0.0 and cap > 0:
            groups.setdefault((qv, cap), []).append(i)
    if not groups:
        return out
    k_top = max(cap for _, cap in groups)
    cost, slopes = _width_curve(step_ms, batch, k_top, slopes=True)
    total = sum(cap * len(members) for (_, cap), members in groups.items())
    # Marginal gains q^j in decreasing order, lazily: one run of len(members) equal units
    # per (group, j); j + 1 enters the heap only after j left it (a prefix per request).
    heap = [(-qv, qv, cap, 1) for qv, cap in groups]
    heapq.heapify(heap)
    best, best_d = cost(0) / batch, 0
    d, gained, taken = 0, 0.0, []
    while heap:
        neg_g, qv, cap, j = heapq.heappop(heap)
        g, m = -neg_g, len(groups[qv, cap])
        # Beyond d the cost grows at least at the smallest slope ahead and the tokens at
        # most by g per draft: the ratio is then monotone in the drafts added, so if it
        # cannot beat the best even after all of them, no later point can.
        rest = total - d
        if cost(d) + slopes[min(d // batch, k_top - 1)] * rest >= \
                best * (batch + gained + g * rest) * (1.0 - 1e-12):
            break
        knot = (d // batch + 1) * batch      # cost-curve knots inside the run
        while knot < d + m:
            v = cost(knot) / (batch + gained + g * (knot - d))
            if v < best * (1.0 - 1e-12):
                best, best_d = v, knot
            knot += batch
        d, gained = d + m, gained + g * m
        v = cost(d) / (batch + gained)
        if v < best * (1.0 - 1e-12):
            best, best_d = v, d
        taken.append((qv, cap, j, m))
        if j < cap:
            heapq.heappush(heap, (-(g * qv), qv, cap, j + 1))
    left = best_d
    for qv, cap, j, m in taken:
        if left <= 0:
            break
        take = min(m, left)
        for i in groups[qv, cap][:take]:
            out[i] = j
        left -= take
    return out


def break_even_batch(c_base: float, c_tok: float, accepted: float, proposed: float) -> float:
    """The batch size B* beyond which drafting stops paying (Eq. 1-2).

    Without drafting a pass over B requests costs c_base + c_tok B and advances each by
    one token; drafting p tokens per request with a accepted on average costs
    c_base + c_tok B (1 + p) and advances each by 1 + a.  Equal cost per token:
    (1 + a)(c_base + c_tok B) = c_base + c_tok B (1 + p)  ⇒  B* = c_base a / (c_tok (p − a)).
    Drafting pays for B < B*.  ``inf`` if p ≤ a (nothing wasted) or c_tok = 0; 0 if a = 0.
    """
    c_base = _check_real("c_base", c_base, lo=0.0)
    c_tok = _check_real("c_tok", c_tok, lo=0.0)
    accepted = _check_real("accepted", accepted, lo=0.0)
    proposed = _check_real("proposed", proposed, lo=0.0)
    if proposed <= accepted:
        return math.inf
    if accepted == 0.0 or c_base == 0.0:
        return 0.0
    if c_tok == 0.0:
        return math.inf
    return c_base * accepted / (c_tok * (proposed - accepted))


__all__ = ["batch_cap", "break_even_batch", "chain_accepted", "cost_cap", "phase_budgets",
           "phase_ms_per_token"]
