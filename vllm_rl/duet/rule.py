"""DUET in the engine: marker-gated abort with eps-keep (Sec. 3.2, Eq. 5; Alg. A.10 l.12-33).

Per sample, with ``t`` its number of generated tokens:

* polling (l.17): from ``t >= K1`` on, every ``poll`` tokens, the sample's incremental
  marker detector reads the bytes of the tokens generated since its last poll
  (:mod:`vllm_rl.duet.markers`, over the vocabulary table of :mod:`vllm_rl.duet.vocab`:
  no decoding); the detectors fire only on a complete answer span, so a sample whose
  marker fires ends at that poll (tail trim, l.20: within ``poll <= G`` tokens of the
  marker, never past ``tau_marker + G``; a DAS step ends it at the step's end, up to
  its drafts later);
* gate (l.23-30): a sample reaching ``t >= K2 + G`` with no marker draws one coin,
  reproducible from the request seed: with probability ``1 - eps`` it is aborted now
  (weight 0), else it is kept to its natural end with weight ``1/eps`` (no trim, no
  second coin);
* a step of several tokens (speculative decoding) is read as steps of one token would
  read it (:func:`step`): the same tokens are trimmed, meet the coin or run on, whatever
  the steps' sizes;
* every other sample is kept with propensity 1.

Inside a DARTS group (the composition rule, ``docs/ARCHITECTURE.md``) the gate is the
same, eps included: a sample its coin keeps is DUET's marker-less tail and leaves DARTS's
pool (never counted toward M, never cancelled by an early stop, always in the training
group with weight 1/eps), so DUET's estimator stays unbiased and DARTS selects among
the rest.

``K1``/``K2`` come from the flags or from :class:`OnlineThresholds` (App. A.3): quantiles
of the *natural* stopping length, estimated from every DUET sample's end with the samples
that other techniques (or the gate itself, or ``max_tokens``) cut short counted as
right-censored, and the coins' survivors reweighted by their inverse propensities.  The
policy only decides; the scheduler ends the request.

Per step a DUET sample costs one integer comparison (``num_tokens < next_check``) except
at a poll or at the gate; a poll costs the join of its new tokens' bytes and a resumed
scan (:class:`~vllm_rl.duet.markers.Marker`).
"""
from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field

from vllm_rl.coins import seeded_uniform
from vllm_rl.duet.markers import Marker
from vllm_rl.flags import DuetFlags


class Action(enum.Enum):
    TRIM = "trim"        # marker fired: the answer is complete, end the sample
    ABORT = "abort"      # past K2 + G with no marker, coin says abort


@dataclass
class DuetState:
    """One sample's DUET state, created at admission."""

    flags: DuetFlags
    detector: Marker
    k1: int
    k2: int
    coin: float                       # U ~ Uniform[0, 1), drawn once from the seed
    eps: float = -1.0                 # the keep probability at the gate; negative: the
                                      # flags' eps
    next_poll: int = 0
    marker_pos: int | None = None     # tokens generated when the marker was seen
    keep_decided: bool = False        # the gate has been reached (l.24)
    next_check: int = 0               # tokens at which step() next has something to do
    prior_fired: bool = False         # a continuation whose earlier tokens hold the marker
                                      # (not polled before its step ended): its next poll fires
    gate_open: bool = True            # the regime gate left the abort on (regime_gate.py)
    markerless_share: float | None = None   # the share that stood at its admission

    def __post_init__(self) -> None:
        if self.eps < 0:
            self.eps = self.flags.eps
        self._plan()

    def _plan(self) -> None:
        """The next token count at which a poll or the gate is due."""
        if self.keep_decided:
            self.next_check = 1 << 62
        else:
            self.next_check = min(max(self.k1, self.next_poll), self.k2 + self.flags.grace)

    @property
    def keep_prob(self) -> float:
        """p_abort of Eq. 6: the propensity with which this sample was kept."""
        return self.eps if self.keep_decided else 1.0

    @property
    def weight(self) -> float:
        """Importance weight of a kept sample: 1/eps after the coin, else 1."""
        return 1.0 / self.eps if self.keep_decided and self.eps > 0 else 1.0


def seeded_coin(seed: int | None, prompt_token_ids, request_id: str) -> float:
    """The keep coin, fresh randomness independent of the generated tokens (Thm. 3, A5).

    A seeded request draws it from its seed and its prompt (each child of an ``n > 1``
    request has its own seed), so a seeded rollout is reproducible and requests that
    share a seed across prompts still get independent coins; an unseeded request draws
    it from its (random) request id.
    """
    return seeded_uniform("duet-coin", seed, prompt_token_ids, request_id)


def last_poll(state: DuetState, t: int) -> int:
    """The last poll instant at or before ``t`` tokens: ``K1``, then every multiple of
    ``poll`` past it (where a run of one token a step polls); -1 before ``K1``."""
    if t < state.k1:
        return -1
    g = t - t % state.flags.poll
    return g if g > state.k1 else state.k1


def step(state: DuetState, num_tokens: int, tokens, table: list[bytes]) -> Action | None:
    """Apply Alg. A.10 l.17-30 after the sample has ``num_tokens`` tokens (``tokens``:
    its output token ids, the last ``len(tokens)`` of the ``num_tokens``; ``table``:
    token id -> bytes).  The caller may skip it while ``num_tokens < state.next_check``:
    nothing is due then.

    A step that made several tokens (speculative decoding) is read as steps of one token
    would read it: the poll reads the tokens up to the last poll instant the step passed
    (:func:`last_poll`), and not past ``K2 + G`` while the gate is open.  So a sample
    whose marker comes after ``K2 + G`` meets its coin there, and the same tokens are
    trimmed, meet the coin or run on whatever the steps' sizes; the sample ends at the
    step's end.
    """
    f = state.flags
    if state.keep_decided:
        return None                                   # eps-kept: runs to its natural end
    action = None
    gate = state.k2 + f.grace
    at = last_poll(state, min(num_tokens, gate))
    if at >= 0 and at >= state.next_poll:
        state.next_poll = at - at % f.poll + f.poll
        seen = max(at - (num_tokens - len(tokens)), 0)   # a continuation's follow its prior
        view = tokens if seen >= len(tokens) else tokens[:seen]
        if state.detector.poll(table, view) or state.prior_fired:
            state.marker_pos = num_tokens
            action = Action.TRIM
    if action is None and num_tokens >= gate:
        state.keep_decided = True
        if state.coin >= state.eps:
            action = Action.ABORT
    state._plan()
    return action


def scaled_grace(max_tokens: int) -> int:
    """G scaled to the response limit: App. A.3 uses G = 150 tokens at 3,072."""
    return max(8, round(150 * max_tokens / 3072))


@dataclass
class OnlineThresholds:
    """K1 = p30 and K2 = p80 of the natural stopping length over the last 1024 DUET
    samples, refit every 10 rounds (App. A.3: window W = 1,024, refit cadence N = 10,
    K1 ← p30, K2 ← p80; cold start K1 = 0.3 L_max, K2 = 0.7 L_max).

    One estimator per marker kind.  The paper fills its window with "kept rollouts"; here
    the lengths that matter are the *natural* ones, and many samples never show theirs:
    the gate aborts the long ones, ``max_tokens`` cuts others, DARTS cancels a stopped
    group's live members, ARRoL prunes at ``l_detect``.  Taking only the lengths that
    did end would estimate the quantiles of a distribution the gate itself truncated, and
    every refit would lower K2 again (a ratchet).  So each sample's end enters the window
    as an observation ``(length, ended, weight)``:

    * ended by the model or at its marker (EOS, stop, DUET trim): an event at its length;
    * cut short (``max_tokens``, DARTS cancel): right-censored at its length (its natural
      length is longer);
    * a coin's survivor carries the inverse of its propensity (inverse-probability-of-
      censoring weights): 1/eps for one kept at the gate, 1/p for one that survived
      ARRoL's coin; the coins' casualties leave (aborted at the gate, ARRoL-pruned).

    The estimate pools every prompt.  ``max_tokens`` censors independently of a sample's
    length; a DARTS stop does so only *within* a prompt: it cancels at the M-th shortest
    length of the sample's own siblings, earlier where the prompt's lengths are shorter.
    Pooled, a short prompt's censored samples are given the hazard of the prompts still
    at risk past their cut, the longer ones, so the estimate errs *long*: K1/K2 at or
    above the natural quantiles, the gate later, fewer aborts (``tests/unit/
    test_duet_rule.py``: +11% to +45% at p80 with prompts of 10x different mean length
    and M of M' = 7 of 8 to 8 of 12).  It cannot err the other way by this mechanism,
    and per prompt the tail past a DARTS stop is never seen (stratifying by prompt, the
    per-prompt estimates stop below the quantile and err longer still).  Where the gate
    sits changes only DUET's speed: its estimator is unbiased for any K1/K2, the coin
    being independent of the sample.

    :func:`km_quantile` reads the weighted Kaplan–Meier estimate.  Until the first refit
    the cold start is ``0.3 * L_max`` / ``0.7 * L_max`` with ``L_max`` the request's
    ``max_tokens``.  A *round* ends each time the engine has no DUET sample left (one
    rollout step of a synchronous RL loop).
    """

    window: int = 1024
    refit_every: int = 10
    observations: deque = field(default_factory=deque)
    rounds: int = 0
    k1: int | None = None
    k2: int | None = None

    def thresholds(self, max_tokens: int) -> tuple[int, int]:
        if self.k1 is None or self.k2 is None:
            return int(0.3 * max_tokens), int(0.7 * max_tokens)
        return self.k1, self.k2

    def observe(self, length: int, ended: bool = True, weight: float = 1.0) -> None:
        self.observations.append((int(length), bool(ended), float(weight)))
        if len(self.observations) > self.window:
            self.observations.popleft()

    def end_round(self) -> None:
        self.rounds += 1
        if self.rounds % self.refit_every == 0 and self.observations:
            obs = list(self.observations)
            self.k1 = km_quantile(obs, 0.30)
            self.k2 = max(self.k1, km_quantile(obs, 0.80))


def km_quantile(observations, q: float) -> int:
    """The ``q``-quantile of a length distribution from weighted right-censored
    observations ``(length, ended, weight)``: the smallest length t at which the
    weighted Kaplan–Meier estimate of P(L <= t) reaches ``q``.  If it never does (too
    much mass censored beyond the last event), the largest observed length: the natural
    length of more than ``1 - q`` of the samples lies past everything seen."""
    events: dict[int, float] = {}
    for length, ended, w in observations:
        if ended:
            events[length] = events.get(length, 0.0) + w
    at_risk = sum(w for _, _, w in observations)
    by_len = sorted(observations)
    survival, j = 1.0, 0
    for t in sorted(events):
        while j < len(by_len) and by_len[j][0] < t:     # left the risk set before t
            at_risk -= by_len[j][2]
            j += 1
        if at_risk > 0:
            survival *= 1.0 - events[t] / at_risk
        if 1.0 - survival >= q - 1e-12:
            return t
    return max(length for length, _, _ in observations)


__all__ = ["Action", "DuetState", "OnlineThresholds", "km_quantile", "last_poll", "seeded_coin", "step"]
