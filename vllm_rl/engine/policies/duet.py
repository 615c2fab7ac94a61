"""DUET in the engine: marker-gated abort with eps-keep (Sec. 3.2, Eq. 5; Alg. A.10 l.12-33).

Per sample, with ``t`` its number of generated tokens:

* polling (l.17): from ``t >= K1`` on, every ``poll`` tokens, the marker detector reads
  the decoded last 256 tokens; the detectors fire only on a complete answer span, so a
  sample whose marker fires ends at that poll (tail trim, l.20: within ``poll <= G``
  tokens of the marker, never past ``tau_marker + G``);
* gate (l.23-30): a sample reaching ``t >= K2 + G`` with no marker draws one coin,
  reproducible from the request seed: with probability ``1 - eps`` it is aborted now
  (weight 0), else it is kept to its natural end with weight ``1/eps`` (no trim, no
  second coin);
* every other sample is kept with propensity 1.

``K1``/``K2`` come from the flags or from :class:`OnlineThresholds` (App. A.3).  The
policy only decides; the scheduler ends the request.
"""
from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field

from vllm_rl.control.duet import percentile
from vllm_rl.engine.policies import seeded_uniform
from vllm_rl.engine.policies.markers import Detector
from vllm_rl.flags import DuetFlags

WINDOW_TOKENS = 256      # the detector reads the last 256 tokens (App. A.3)


class Action(enum.Enum):
    TRIM = "trim"        # marker fired: the answer is complete, end the sample
    ABORT = "abort"      # past K2 + G with no marker, coin says abort


@dataclass
class DuetState:
    """One sample's DUET state, created at admission."""

    flags: DuetFlags
    detector: Detector
    k1: int
    k2: int
    coin: float                       # U ~ Uniform[0, 1), drawn once from the seed
    next_poll: int = 0
    marker_pos: int | None = None     # tokens generated when the marker was seen
    keep_decided: bool = False        # the gate has been reached (l.24)

    @property
    def keep_prob(self) -> float:
        """p_abort of Eq. 6: the propensity with which this sample was kept."""
        return self.flags.eps if self.keep_decided else 1.0

    @property
    def weight(self) -> float:
        """Importance weight of a kept sample: 1/eps after the coin, else 1."""
        return 1.0 / self.flags.eps if self.keep_decided else 1.0


def seeded_coin(seed: int | None, prompt_token_ids, request_id: str) -> float:
    """The keep coin, fresh randomness independent of the generated tokens (Thm. 3, A5).

    A seeded request draws it from its seed and its prompt (each child of an ``n > 1``
    request has its own seed), so a seeded rollout is reproducible and requests that
    share a seed across prompts still get independent coins; an unseeded request draws
    it from its (random) request id.
    """
    return seeded_uniform("duet-coin", seed, prompt_token_ids, request_id)


def step(state: DuetState, num_tokens: int, text_of_tail) -> Action | None:
    """Apply Alg. A.10 l.17-30 after the sample has ``num_tokens`` tokens.

    ``text_of_tail()`` decodes the last :data:`WINDOW_TOKENS` tokens; it is called only
    on a poll.
    """
    f = state.flags
    if state.keep_decided:
        return None                                   # eps-kept: runs to its natural end
    if num_tokens >= state.k1 and num_tokens >= state.next_poll:
        state.next_poll = num_tokens - num_tokens % f.poll + f.poll
        if state.detector(text_of_tail()):
            state.marker_pos = num_tokens
            return Action.TRIM
    if num_tokens >= state.k2 + f.grace:
        state.keep_decided = True
        if state.coin >= f.eps:
            return Action.ABORT
    return None


@dataclass
class OnlineThresholds:
    """K1 = p30 and K2 = p80 of the last 1024 kept samples' lengths (App. A.3).

    One estimator per marker kind.  The window takes the realised length of every kept
    sample (trimmed, eps-kept or natural; never aborted).  A *round* ends each time the
    engine has no DUET sample left (one rollout step of a synchronous RL loop); every
    ``refit_every`` rounds the quantiles are refit.  Until the first refit the cold start
    is ``0.3 * L_max`` / ``0.7 * L_max`` with ``L_max`` the request's ``max_tokens``.
    """

    window: int = 1024
    refit_every: int = 10
    lengths: deque = field(default_factory=deque)
    rounds: int = 0
    k1: int | None = None
    k2: int | None = None

    def thresholds(self, max_tokens: int) -> tuple[int, int]:
        if self.k1 is None or self.k2 is None:
            return int(0.3 * max_tokens), int(0.7 * max_tokens)
        return self.k1, self.k2

    def observe(self, length: int) -> None:
        self.lengths.append(length)
        if len(self.lengths) > self.window:
            self.lengths.popleft()

    def end_round(self) -> None:
        self.rounds += 1
        if self.rounds % self.refit_every == 0 and self.lengths:
            self.k1 = round(percentile(self.lengths, 30))
            self.k2 = round(percentile(self.lengths, 80))
