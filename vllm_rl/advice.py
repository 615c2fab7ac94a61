"""What each technique's gate decides from a regime (:class:`vllm_rl.regime.Regime`).

One :class:`Verdict` per technique: switch it on, leave it off, or no evidence (the
records cannot say).  The thresholds are declared here once, each with its source:

* **DUET** (Sec. 3.2, App. A.4): its gate aborts the samples that reach ``K2 + G`` with
  no marker, each kept with probability eps at weight 1/eps.  The paper's gain is
  measured where that share is 1.2-6% (:data:`vllm_rl.duet.regime_gate.MARKERLESS_MAX`,
  which the engine's own ``duet.regime_gate`` reads too); above it the 1/eps
  samples carry a large part of a step's weight (``docs/benchmarks.md``, "Time to
  accuracy": 16% on the first kit, -0.021 at equal time).  With no tokens after the
  first answer the trim saves nothing.
* **DARTS** (Sec. 3.2.1, 4.3.1): its extra samples pay where a step waits for its tail
  (:func:`vllm_rl.darts.regime_gate.in_regime`, the test its planner's ``regime_gate``
  reads too: a tail 5-10x the median, Sec. 1, or where the limit cuts the tail, ~5% of
  samples at it, Sec. 4.3.1).  DARTS's own ρ (App. B) sets how many extra samples, not
  whether: it is 0.80-0.85 on both kits.
* **ARRoL** (Sec. 4.2, App. A.4): pruning steers only where the head ranks samples within
  their groups; the project's floor is :data:`vllm_rl.arrol.controller.AUC_GATE` (the
  engine's own steering gate decides step by step).
* **DAS** (Sec. 4): lossless; its confidence cap prices each draft every step, so it
  drafts only where verification costs less than it saves; the acceptance says how much.

Each verdict names the benchmark row it rests on (:data:`ROWS`).  :func:`verdicts` reads
a regime from samples (a regime log, :class:`vllm_rl.regime.Regime`); :func:`served`
reads what a server's ``/metrics`` gives (:class:`vllm_rl.served_regime.ServedRegime`),
with the same thresholds.
"""
from __future__ import annotations

from dataclasses import dataclass

from vllm_rl.darts import regime_gate as darts_regime
from vllm_rl.duet.regime_gate import in_regime
from vllm_rl.regime import Regime
from vllm_rl.served_regime import ServedRegime


ON, OFF, NO_EVIDENCE = "on", "off", "no evidence"

# The rows each verdict rests on (docs/benchmarks.md by section, or the paper where the
# project has no end-to-end run in that regime yet), by (technique, decision).
ROWS = {
    ("duet", OFF): "Time to accuracy: duet:gate -0.021 (-0.038 to -0.004) at equal time on "
                   "the first kit, 16% marker-less at the gate",
    ("duet", ON): "One rollout step on the reasoning kit: DUET 2.04x at 16 x 8, from its trim; "
                  "DUET Table 3: 2.51x at eps 0.05 (Qwen3-1.7B, MATH, 1.2-6% marker-less); "
                  "no end-to-end run on the reasoning kit yet",
    ("darts", OFF): "Time to accuracy: DARTS on top of DAS 1.12-1.15x against DAS's "
                    "1.20-1.27x on the first kit (response limit 256, 3.4% cut by it)",
    ("darts", ON): "DARTS Sec. 5.2: 1.29-1.77x over VeRL (Qwen 3B-32B, DAPO-MATH), from what "
                   "it selects; one rollout step on the reasoning kit: 0.92x at 16 x 8 (a "
                   "step is no shorter); no end-to-end run on the reasoning kit yet",
    ("arrol", OFF): "ARRoL's gate: where steering helps (vllm-rl bench arrol-gate)",
    ("arrol", ON): "ARRoL's gate: where steering helps (vllm-rl bench arrol-gate)",
    ("arrol", NO_EVIDENCE): "ARRoL's gate: where steering helps (vllm-rl bench arrol-gate)",
    ("duet", NO_EVIDENCE): "DUET App. A.4: its gain measured at 1.2-6% marker-less",
    ("darts", NO_EVIDENCE): "DARTS Sec. 1, 4.3.1: a tail 5-10x the median, or ~5% cut",
    ("das", ON): "Time to accuracy: das 1.29x (1.24-1.34) at equal accuracy, host counted, "
                 "16 x 8 on the first kit; 64 x 8 end to end: seed 0 below stock",
}


@dataclass(frozen=True)
class Verdict:
    technique: str
    decision: str          # ON, OFF or NO_EVIDENCE
    why: str
    rests_on: str


def _verdict(technique: str, decision: str, why: str) -> Verdict:
    """A verdict with the row its decision rests on (:data:`ROWS`)."""
    return Verdict(technique, decision, why, ROWS[(technique, decision)])


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _at_gate(share: float, gate: int | None) -> str:
    where = "the gate K2 + G" + ("" if gate is None else f" = {gate}")
    return f"{_pct(share)} of samples reach {where} with no marker"


def duet(r: Regime) -> Verdict:
    at_gate = _at_gate(r.markerless_at_gate, r.gate)
    if not in_regime(r.markerless_at_gate):
        return _verdict("duet", OFF, f"{at_gate}, above the paper's 6% (App. A.4): its 1/eps "
                       "samples would carry a large share of each step")
    trim = (f"the trim removes the {_pct(r.share_after_first_answer)} of tokens written "
            "after the first answer" if r.share_after_first_answer > 0 else
            "no tokens come after the first answer: the trim saves nothing")
    return _verdict("duet", ON, f"{at_gate}, within the paper's 1.2-6% (App. A.4); {trim}")


def darts(r: Regime) -> Verdict:
    tail = r.length_p99 / max(r.length_p50, 1.0)
    cut = r.length_p99 >= r.max_tokens
    long_tail = darts_regime.in_regime(r.truncated, tail, cut)
    ratio = (f"length p99/p50 {tail:.1f}x, p99 at the limit" if cut else
             f"length p99/p50 {tail:.1f}x (DARTS Sec. 1: 5-10x)")
    return _verdict(
        "darts", ON if long_tail else OFF,
        f"{ratio}; {_pct(r.truncated)} cut by the limit (~5%: Sec. 4.3.1); rho {r.rho:.2f}: "
        + ("the step waits for its tail" if long_tail else
           "the tail is too short for the extra samples to pay"))


def arrol(r: Regime) -> Verdict:
    if r.head_auc_within is None:
        return _verdict("arrol", NO_EVIDENCE, "no sample carries both a head score and a "
                       "reward (ARRoL flags at l_detect, rewards in the records)")
    return _arrol(r.head_auc_within, f"over {r.scored} scored samples (pooled "
                  f"{r.head_auc:.2f})")


def _arrol(within: float, over: str) -> Verdict:
    from vllm_rl.arrol.controller import AUC_GATE

    ranks = within >= AUC_GATE
    return _verdict("arrol", ON if ranks else OFF,
                   f"the head's within-group AUC {within:.2f} {over}, the floor {AUC_GATE}: "
                   + ("it ranks within groups; the engine's steering gate decides each step"
                      if ranks else "it does not rank within groups; pruning would not steer"))


def das(r: Regime) -> Verdict:
    return _das(r.draft_acceptance, r.draft_tokens)


def _das(acceptance: float | None, tokens: int) -> Verdict:
    if acceptance is None:
        return _verdict("das", ON, "no drafts in the records; DAS is lossless and its cost "
                       "cap drafts only where verification pays")
    return _verdict("das", ON, f"{acceptance:.2f} accepted tokens per draft token "
                   f"over {tokens} draft tokens; lossless, and its cost cap drafts "
                   "only where verification pays")


def verdicts(r: Regime) -> list[Verdict]:
    """Every technique's verdict, in the order the brief names them."""
    return [arrol(r), duet(r), das(r), darts(r)]


# ----------------------------------------------------------- from a server's /metrics
def served(s: ServedRegime) -> list[Verdict]:
    """Every technique's verdict from ``/metrics`` (:class:`ServedRegime`): the same
    thresholds; a length quantile is a histogram bucket, so DARTS's tail ratio decides
    only where the buckets leave no doubt."""
    return [_served_arrol(s), _served_duet(s), _das(s.draft_acceptance, s.draft_tokens),
            _served_darts(s)]


def _served_duet(s: ServedRegime) -> Verdict:
    if s.markerless_at_gate is None:
        return _verdict("duet", NO_EVIDENCE, "no DUET sample has ended with the engine's "
                       "share measured (it needs 256 DUET samples): send a few steps with "
                       "duet flags, or read a regime log")
    at_gate = _at_gate(s.markerless_at_gate, None)
    shut = "" if s.duet_gate_open in (None, True) else "; duet.regime_gate has it shut"
    if not in_regime(s.markerless_at_gate):
        return _verdict("duet", OFF, f"{at_gate}, above the paper's 6% (App. A.4){shut}")
    return _verdict("duet", ON, f"{at_gate}, within the paper's 1.2-6% (App. A.4); the "
                   "tokens after the answer are not on /metrics (a regime log has them)")


def _served_darts(s: ServedRegime) -> Verdict:
    if s.truncated is None or s.length_p50 is None or s.length_p99 is None:
        return _verdict("darts", NO_EVIDENCE, "no flagged sample has ended by itself or at "
                       "the limit on this server")
    cut = s.truncated >= darts_regime.CUT_SHARE     # p99 at the limit
    (lo50, hi50), (lo99, hi99) = s.length_p50, s.length_p99
    least, most = lo99 / max(hi50, 1.0), hi99 / max(lo50, 1.0)
    said = f"{_pct(s.truncated)} cut by the limit (~5%: Sec. 4.3.1)"
    if cut:
        on = darts_regime.in_regime(s.truncated, 0.0, True)
        return _verdict("darts", ON if on else OFF, f"p99 at the limit; {said}: " + (
            "the step waits for its tail" if on else "too few run into the limit"))
    ratio = f"length p99/p50 between {least:.1f}x and {most:.1f}x (DARTS Sec. 1: 5-10x)"
    if darts_regime.in_regime(s.truncated, least, False):
        return _verdict("darts", ON, f"{ratio}; {said}: the step waits for its tail")
    if not darts_regime.in_regime(s.truncated, most, False):
        return _verdict("darts", OFF, f"{ratio}; {said}: the tail is too short for the "
                       "extra samples to pay")
    return _verdict("darts", NO_EVIDENCE, f"{ratio}: the histogram's buckets straddle "
                   "the 5x threshold (a regime log gives the quantiles)")


def _served_arrol(s: ServedRegime) -> Verdict:
    if s.head_auc_within is None:
        return _verdict("arrol", NO_EVIDENCE, "no calibrated head has scored a sample on "
                       "this server (the trainer pushes the held-out AUC with its "
                       "calibration)")
    return _arrol(s.head_auc_within, "held out, from the trainer's last calibration")
