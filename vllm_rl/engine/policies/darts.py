"""DARTS in the engine: proactive early stop and dual-end selection (Alg. 2).

The scheduler asks :func:`should_stop` each time a group member ends naturally; once
it says so, the scheduler cancels every other member and frees their KV blocks
(Alg. 2, line 12: ``Rollout(q_i, size=M'_i, early_stop=M)``).  The selection functions
are pure and shared by the engine tests and the client-side annotation.
"""
from __future__ import annotations

from typing import Sequence

from vllm_rl.flags import DartsFlags, GroupFlags


def should_stop(darts: DartsFlags, group: GroupFlags, num_valid_finished: int) -> bool:
    """Early stop (Sec. 4.3.1): the M shortest valid samples have finished."""
    return darts.early_stop(group) and num_valid_finished >= group.size


def shortest_selection(lengths: Sequence[int], valid: Sequence[bool], m: int,
                       excluded: Sequence[bool] | None = None) -> list[str | None]:
    """Shortest-only sampling: the ``m`` shortest valid samples form the group.

    If fewer than ``m`` are valid, the shortest invalid samples (cut at the length
    limit) fill the group, never an ``excluded`` one (cancelled, or aborted by DUET),
    so the trainer gets ``m`` whenever it can.  Returns ``"shortest"`` for the selected
    and ``None`` for the others.
    """
    n = len(lengths)
    excluded = excluded or [False] * n
    order = sorted(range(n), key=lambda i: (not valid[i], lengths[i], i))
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
