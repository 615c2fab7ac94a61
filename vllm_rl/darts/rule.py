"""DARTS in the engine: proactive early stop and dual-end selection (Alg. 2).

Early stop (Alg. 2, line 12: ``Rollout(q_i, size=M'_i, early_stop=M)``) keeps the M
shortest valid samples of the whole group.  The M-th sample to *finish* is not
necessarily among the M *shortest*: siblings admitted in later steps (a group larger
than the running limit, chunked prefill, preemption, single requests) or advancing
several tokens per step (speculative decoding) finish in another order than their
lengths.  :func:`selection_final` is the exact rule: a finished sample of length ℓ is
known to be among the M shortest only once every sibling still generating has at
least ℓ tokens (it can then only end longer).  The scheduler checks it after every
step and only then cancels the others and frees their KV blocks.

Ties between equal lengths go to the sample that finished first (the group's
``finish_rank``: an earlier step, then the engine's processing order within the
step); a sibling still generating when the rule fires always ends longer.  The
selection functions are pure and shared by the engine and the client-side
annotation (:func:`annotate_group`), which applies the same key.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Sequence

from vllm_rl.flags import DartsFlags, GroupFlags
from vllm_rl.outcome import Reason, RolloutInfo


def watches(darts: DartsFlags | None, group: GroupFlags | None, num_valid_finished: int) -> bool:
    """The group can stop early and has at least M valid samples finished."""
    return (darts is not None and group is not None and darts.early_stop(group)
            and num_valid_finished >= group.size)


def selection_final(finished: Sequence[tuple[int, int]], m: int,
                    live_lengths: Iterable[int], missing: int = 0) -> bool:
    """The M shortest valid samples of the group are known (exact early stop).

    ``finished``: ``(length, finish_rank)`` of the valid samples that ended;
    ``live_lengths``: tokens generated so far by each sibling still generating (0 for
    one still waiting for its prefill); ``missing``: siblings not yet arrived.  With
    ℓ_M the M-th smallest finished length, every live sibling ends with more than its
    current count, so once each has at least ℓ_M tokens none can end shorter than, or
    tie with, a selected sample.
    """
    if len(finished) < m or missing > 0:
        return False
    l_m = sorted(finished)[m - 1][0]
    return all(c >= l_m for c in live_lengths)


def shortest_selection(lengths: Sequence[int], valid: Sequence[bool], m: int,
                       excluded: Sequence[bool] | None = None,
                       ranks: Sequence[int | None] | None = None) -> list[str | None]:
    """Shortest-only sampling: the ``m`` shortest valid samples form the group.

    Valid samples are ordered by ``(length, ranks[i])`` — the engine's tie rule, the
    earlier finisher first — or by index when no ranks are given.  If fewer than ``m``
    are valid, the shortest invalid samples (cut at the length limit) fill the group,
    never an ``excluded`` one (cancelled, or aborted by DUET), so the trainer gets
    ``m`` whenever it can.  Returns ``"shortest"`` for the selected and ``None`` for
    the others.
    """
    n = len(lengths)
    excluded = excluded or [False] * n
    tie = [r if r is not None else n + i for i, r in enumerate(ranks)] if ranks else list(range(n))
    order = sorted(range(n), key=lambda i: (not valid[i], lengths[i], tie[i], i))
    marks: list[str | None] = [None] * n
    taken = 0
    for i in order:
        if taken == m:
            break
        if excluded[i]:
            continue
        marks[i] = "shortest"
        taken += 1
    return marks


def dual_end_selection(lengths: Sequence[int], valid: Sequence[bool], m: int,
                       k: int) -> list[str | None]:
    """Dual-end length sampling (Sec. 4.1.2, Alg. 2 lines 6-9).

    The ``k`` shortest valid samples are marked ``"short"`` and the ``L = m - k``
    longest valid ones ``"long"``; samples cut at the length limit or cancelled are
    never among the longest.  With fewer than ``m`` valid samples all valid ones are
    selected (short end first).
    """
    idx = sorted((i for i in range(len(lengths)) if valid[i]), key=lambda i: (lengths[i], i))
    marks: list[str | None] = [None] * len(lengths)
    short, rest = idx[:k], idx[k:]
    longest = rest[max(0, len(rest) - (m - k)):] if m > k else []
    for i in short:
        marks[i] = "short"
    for i in longest:
        marks[i] = "long"
    return marks



def annotate_group(infos: list[RolloutInfo], size: int, k: int,
                   early_stop: bool) -> list[RolloutInfo]:
    """Mark the training group of one prompt's samples (DARTS Alg. 2).

    Early stop: the engine stopped the group once its M shortest valid samples were
    known (ties: the earlier finisher); they are ``selected`` as ``"shortest"``.  A
    valid sample that finished but is longer than those stays unselected (weight 0);
    samples cut at the length limit fill a group with fewer than M valid; cancelled,
    DUET-aborted and ARRoL-pruned ones never do.  Dual-end: the ``k`` shortest valid samples and
    the ``size - k`` longest valid ones (never one cut at the length limit,
    Sec. 4.1.2) are selected.  Unselected samples get weight 0.

    DUET's eps-kept samples (:attr:`~vllm_rl.outcome.RolloutInfo.eps_kept`) are outside
    DARTS's pool (the composition rule): they compete for none of the M slots and are
    always selected, as ``"eps_kept"``, with their 1/eps weight (Eq. 6), so DUET's
    estimator of its marker-less tail stays unbiased inside the group.
    """
    tail = [i.eps_kept for i in infos]
    lengths = [i.length for i in infos]
    valid = [i.valid and not t for i, t in zip(infos, tail)]
    if early_stop:
        excluded = [t or i.reason in (Reason.DARTS_CANCELLED, Reason.DUET_ABORTED,
                                      Reason.ARROL_PRUNED) for i, t in zip(infos, tail)]
        marks = shortest_selection(lengths, valid, size, excluded,
                                   [i.finish_rank for i in infos])
    else:
        marks = dual_end_selection(lengths, valid, size, k)
    out = []
    for info, mark, t in zip(infos, marks, tail):
        mark = "eps_kept" if t else mark
        out.append(replace(info, selected=mark is not None, selection=mark,
                           weight=info.weight if mark is not None else 0.0))
    return out


__all__ = ["annotate_group", "dual_end_selection", "selection_final", "shortest_selection", "watches"]
