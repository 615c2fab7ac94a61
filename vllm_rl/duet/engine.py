"""DUET's state in the engine: per-sample gates, the online thresholds, rounds, weights.

The RL scheduler (:mod:`vllm_rl.engine.scheduler`) owns one :class:`DuetEngine` and calls
it at four points; everything DUET knows lives here:

* :meth:`DuetEngine.admit` (per request, at admission): the sample's
  :class:`~vllm_rl.duet.rule.DuetState`: thresholds (the flags', or the online
  estimate's for its marker kind, App. A.3), its seeded keep coin (Thm. 3, A5), its
  incremental marker detector, and the gate's ``eps`` (the flags', inside a DARTS group
  too: the composition rule of ``docs/ARCHITECTURE.md`` keeps an eps-kept sample out of
  DARTS's pool instead);
* :meth:`DuetEngine.step` (per DUET request per step): one comparison unless a poll
  or the gate is due (Alg. A.10 l.17-30, :func:`vllm_rl.duet.rule.step`);
* :meth:`DuetEngine.observe` (per sample, at its end): its length into its kind's
  natural-length window, as an event or right-censored, with inverse-propensity weights
  (1/eps for a coin's survivor, 1/p for one that survived ARRoL's coin);
* :meth:`DuetEngine.leave` (per sample, when vLLM frees it): a round ends when no DUET
  sample of a kind is left (the App. A.3 refit cadence counts rounds, and the regime
  gate decides then: :mod:`vllm_rl.duet.regime_gate`).

:meth:`DuetEngine.weight` and :meth:`DuetEngine.fields` are DUET's part of a sample's
record (Eq. 6: weight 1/eps after the coin, 0 if aborted).

Markers are matched on token ids: the vocabulary's bytes are read once, at the first
DUET request (:func:`vllm_rl.duet.vocab.token_bytes`); no sample is ever decoded.
"""
from __future__ import annotations

from typing import Any, Callable

from vllm_rl.duet import markers
from vllm_rl.duet import rule
from vllm_rl.duet.regime_gate import MarkerlessShare
from vllm_rl.duet.rule import Action, DuetState, OnlineThresholds
from vllm_rl.duet.vocab import token_bytes
from vllm_rl.flags import DuetFlags
from vllm_rl.outcome import Reason

REASONS = {Action.TRIM: Reason.DUET_TRIMMED, Action.ABORT: Reason.DUET_ABORTED}


def kind_of(flags: DuetFlags) -> str:
    """The marker kind a sample's thresholds are estimated for."""
    return "pattern" if flags.pattern is not None else flags.marker


class DuetEngine:
    """DUET's engine-side state (see the module docstring).  ``load_tokenizer`` gives the
    engine's tokenizer, called once, at the first DUET request."""

    def __init__(self, load_tokenizer: Callable[[], Any], vocab_size: int = 0) -> None:
        self._load_tokenizer = load_tokenizer
        self._vocab_size = vocab_size
        self._table: list[bytes] | None = None
        self.thresholds: dict[str, OnlineThresholds] = {}
        self.regimes: dict[str, MarkerlessShare] = {}
        self.live: dict[str, int] = {}

    @property
    def table(self) -> list[bytes]:
        """Token id -> bytes, built once (:mod:`vllm_rl.duet.vocab`)."""
        if self._table is None:
            self._table = token_bytes(self._load_tokenizer(), self._vocab_size)
        return self._table

    # ------------------------------------------------------------------ per request
    def admit(self, flags: DuetFlags, max_tokens: int, seed: int | None,
              prompt_token_ids, request_id: str, prior=()) -> DuetState:
        """The sample's state at admission (its prompt is read only for a code marker's
        opening fence, once).  ``prior``: a continuation's tokens from earlier steps
        (partial rollouts), fed to its detector once, here: the marker, the poll and the
        gate count the whole sample (the scheduler passes whole-sample token counts)."""
        kind = kind_of(flags)
        online = self.thresholds.setdefault(kind, OnlineThresholds())
        regime = self.regimes.setdefault(kind, MarkerlessShare())
        gate_open = regime.open or not flags.regime_gate
        cold_k1, cold_k2 = online.thresholds(max_tokens)
        fence = "```"
        table = self.table
        if flags.marker == "code" and flags.pattern is None and prompt_token_ids:
            prompt = b"".join([table[t] for t in prompt_token_ids])
            fence = markers.opening_fence(prompt.decode("utf-8", "replace"))
        self.live[kind] = self.live.get(kind, 0) + 1
        detector = markers.marker(flags.marker, flags.pattern, fence)
        fired = bool(prior) and detector.prime(table, prior)
        return DuetState(
            flags=flags, detector=detector,
            k1=cold_k1 if flags.k1 is None else flags.k1,
            k2=cold_k2 if flags.k2 is None else flags.k2,
            coin=rule.seeded_coin(seed, prompt_token_ids, request_id), prior_fired=fired,
            eps=-1.0 if gate_open else 1.0, gate_open=gate_open,
            markerless_share=regime.share)

    def step(self, state: DuetState, num_tokens: int, tokens) -> Reason | None:
        """The sample's DUET end after this step, if any (trimmed at its marker, or
        aborted at the gate).  Hot path: one comparison unless a poll or the gate is due."""
        if num_tokens < state.next_check:
            return None
        action = rule.step(state, num_tokens, tokens, self.table)
        return None if action is None else REASONS[action]

    def observe(self, state: DuetState, reason: Reason, length: int,
                arrol_p: float | None = None) -> None:
        """One sample's end into its kind's natural-length window
        (:class:`~vllm_rl.duet.rule.OnlineThresholds`): an event if the model (or its
        marker) ended it, right-censored if something cut it short; a coin's survivor
        weighted by its inverse propensity (1/eps, and 1/p where ARRoL's coin let it
        through: ``arrol_p``), a coin's casualty left out (ARRoL-pruned, or aborted by
        DUET's own coin).  Every end, casualties too, adds its bit to the kind's
        marker-less share (:mod:`vllm_rl.duet.regime_gate`)."""
        self.regimes[kind_of(state.flags)].observe(state.keep_decided)
        if reason is Reason.ARROL_PRUNED or (reason is Reason.DUET_ABORTED and state.eps > 0):
            return
        weight = 1.0 / state.keep_prob
        if arrol_p:
            weight /= arrol_p
        self.thresholds[kind_of(state.flags)].observe(length, reason.valid, weight)

    def leave(self, state: DuetState) -> None:
        """The sample left the engine; a round ends when its kind has none left."""
        kind = kind_of(state.flags)
        self.live[kind] -= 1
        if self.live[kind] == 0:
            self.thresholds[kind].end_round()
            self.regimes[kind].end_round()

    # ------------------------------------------------------------------ the record
    @staticmethod
    def weight(state: DuetState, reason: Reason) -> float:
        """Eq. 6: 0 if aborted at the gate, 1/eps if its coin kept it, else 1."""
        return 0.0 if reason is Reason.DUET_ABORTED else state.weight

    @staticmethod
    def tail(state: DuetState) -> bool:
        """Past the gate and kept by its coin (eps < 1): DUET's marker-less tail, which
        inside a DARTS group is outside DARTS's pool (never counted toward M, cancelled
        or deselected; ``RolloutInfo.eps_kept`` on the record).  Asked of live samples
        and of ones ending other than by the gate's abort."""
        return state.keep_decided and state.eps < 1.0

    @staticmethod
    def fields(state: DuetState) -> dict:
        return {"marker_pos": state.marker_pos, "keep_prob": state.keep_prob,
                "k1": state.k1, "k2": state.k2, "gate_open": state.gate_open,
                "markerless_share": state.markerless_share}


__all__ = ["DuetEngine", "REASONS", "kind_of"]
