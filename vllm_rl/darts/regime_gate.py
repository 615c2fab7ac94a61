"""DARTS's regime gate: does a step wait for a tail the extra samples can cut?

DARTS's extra samples pay where a step waits for its long tail: a tail "often exceeding
the median length by 5-10x" (Sec. 1: :data:`TAIL_MIN`) or, where the response limit cuts
the tail (p99 at the limit, :data:`CUT_SHARE` or more of the samples end there, so the
ratio says only how far the limit is), a share of samples that run into it
(:data:`TRUNCATED_MIN`, the ~5% of prompts DARTS's tail pruning triggers for, Sec.
4.3.1).  :func:`in_regime` is that test, read by :class:`TailWindow` (the planner's
option ``regime_gate``) and by ``vllm-rl advise`` (:mod:`vllm_rl.advice`).

:class:`TailWindow` keeps the last ``window`` lengths of samples DARTS let run to their
natural end or to the limit: those of prompts planned dual-end (every member runs to its
end) or off, never those of a group stopped early (its cancelled members' lengths are
censored: they would understate the tail).  DARTS's own ρ (App. B) sets how many extra
samples, not whether.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Iterable

TAIL_MIN = 5.0          # DARTS Sec. 1: the tail 5-10x the median length
TRUNCATED_MIN = 0.05    # DARTS Sec. 4.3.1: tail pruning triggers for ~5% of prompts
CUT_SHARE = 0.01        # from this share at the limit on, p99 is the limit itself


def in_regime(truncated: float, tail: float, cut: bool) -> bool:
    """DARTS's regime: ``truncated`` (the share at the limit) at least 5% where the limit
    cuts the tail (``cut``), else p99/p50 (``tail``) at least 5."""
    return truncated >= TRUNCATED_MIN if cut else tail >= TAIL_MIN


def _quantile(xs: list[int], q: float) -> float:
    pos = q * (len(xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclass
class TailWindow:
    """The last ``window`` uncensored lengths and the regime test on them."""

    window: int = 1024
    min_samples: int = 64
    lengths: deque = field(default_factory=deque)

    def observe(self, lengths: Iterable[int]) -> None:
        for x in lengths:
            self.lengths.append(int(x))
            if len(self.lengths) > self.window:
                self.lengths.popleft()

    def test(self, max_tokens: int) -> tuple[bool, float, float] | None:
        """(in the regime, share at the limit, p99/p50), or None with too few lengths."""
        if len(self.lengths) < self.min_samples:
            return None
        xs = sorted(self.lengths)
        truncated = sum(1 for x in xs if x >= max_tokens) / len(xs)
        tail = _quantile(xs, 0.99) / max(_quantile(xs, 0.50), 1.0)
        return in_regime(truncated, tail, truncated >= CUT_SHARE), truncated, tail


__all__ = ["CUT_SHARE", "TAIL_MIN", "TRUNCATED_MIN", "TailWindow", "in_regime"]
