"""DUET's regime gate: is the regime the paper's, so that its gate's abort pays?

DUET's gain is measured where 1.2-6% of the rollouts reach the gate ``K2 + G`` with no
marker (App. A.4, "the realised marker-less rate"; :data:`MARKERLESS_MAX`).  Above it,
the 1/eps samples the coin keeps carry a large part of each step's weight, and the
project's first kit lost accuracy at equal time with 16% marker-less (``docs/
benchmarks.md``, "Time to accuracy").

The engine measures the share where the gate sees it: each ended DUET sample of a
marker kind adds one bit, whether it reached ``K2 + G`` with no marker (aborted there,
or kept by its coin), over the last :attr:`MarkerlessShare.window` samples (App. A.3's
window W = 1,024).  A carried part adds nothing; its continuation adds the sample's bit
when it ends.  At each round's end (the engine has no DUET sample of the kind left, the
cadence of :class:`~vllm_rl.duet.rule.OnlineThresholds`) with at least
:attr:`MarkerlessShare.min_samples` bits, the share decides:

    open  <=>  share <= MARKERLESS_MAX

A request that asks for the regime gate (``duet.regime_gate``) while it is shut meets
the gate with eps = 1: kept to its natural end at weight 1, no abort and no trim after
the gate (as a coin that always keeps).  Every other request is the paper's: its gate
is open whatever the share.  The decision reads only samples that already ended, never
the one it applies to, so eps stays a fixed propensity for each sample and Eq. 6's
estimator stays unbiased.  A carried sample's continuation (partial rollouts) meets the
same coin again: one whose part ran with its gate open is sent with ``regime_gate``
false (:func:`vllm_rl.integrations.common.partial.continuation`), so the coin meets the
same eps; one whose part ran shut (eps = 1) may meet any eps after, its survival then
the later eps.  Each DUET record carries the share that stood at its
admission and whether its gate was open (``markerless_share``, ``gate_open``), and
``/metrics`` the last of them.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

MARKERLESS_MAX = 0.06   # DUET App. A.4: the realised marker-less rate 0.012-0.06


def in_regime(share: float) -> bool:
    """The paper's regime: at most :data:`MARKERLESS_MAX` reach the gate with no marker."""
    return share <= MARKERLESS_MAX


@dataclass
class MarkerlessShare:
    """The share of one marker kind's ended DUET samples that reached ``K2 + G`` with no
    marker, and the regime gate it decides (see the module docstring)."""

    window: int = 1024
    min_samples: int = 256
    bits: deque = field(default_factory=deque)
    count: int = 0
    share: float | None = None        # at the last round's end with min_samples bits
    open: bool = True                 # the paper's gate until the share says otherwise

    def observe(self, markerless: bool) -> None:
        """One ended sample: did it reach the gate with no marker?"""
        self.bits.append(markerless)
        self.count += markerless
        if len(self.bits) > self.window:
            self.count -= self.bits.popleft()

    def end_round(self) -> None:
        """Decide for the next round (open iff the share is at most the paper's 6%)."""
        if len(self.bits) >= self.min_samples:
            self.share = self.count / len(self.bits)
            self.open = in_regime(self.share)


__all__ = ["MARKERLESS_MAX", "MarkerlessShare", "in_regime"]
