"""What each technique's gate decides from a regime (:class:`vllm_rl.regime.Regime`).

One :class:`Verdict` per technique: switch it on, leave it off, or no evidence (the
records cannot say).  The thresholds are declared here once, each with its source:

* **DUET** (Sec. 3.2, App. A.4): its gate aborts the samples that reach ``K2 + G`` with
  no marker, each kept with probability eps at weight 1/eps.  The paper's gain is
  measured where that share is 1.2-6% (:data:`DUET_MARKERLESS_MAX`); above it the 1/eps
  samples carry a large part of a step's weight (``docs/benchmarks.md``, "Time to
  accuracy": 16% on the first kit, -0.021 at equal time).  With no tokens after the
  first answer the trim saves nothing.
* **DARTS** (Sec. 3.2.1, 4.3.1): its extra samples pay where a step waits for its tail:
  a tail "often exceeding the median length by 5-10x" (Sec. 1, :data:`DARTS_TAIL_MIN`),
  or, where the response limit cuts the tail (p99 at the limit: the ratio says only how
  far the limit is), a share of samples that run into it (:data:`DARTS_TRUNCATED_MIN`,
  the ~5% of prompts DARTS's tail pruning triggers for, Sec. 4.3.1).  DARTS's own ρ
  (App. B) sets how many extra samples, not whether: it is 0.80-0.85 on both kits.
* **ARRoL** (Sec. 4.2, App. A.4): pruning steers only where the head ranks samples within
  their groups; the project's floor is :data:`vllm_rl.arrol.controller.AUC_GATE` (the
  engine's own steering gate decides step by step).
* **DAS** (Sec. 4): lossless; its confidence cap prices each draft every step, so it
  drafts only where verification costs less than it saves; the acceptance says how much.

Each verdict names the benchmark row it rests on (:data:`ROWS`).
"""
from __future__ import annotations

from dataclasses import dataclass

from vllm_rl.regime import Regime

DUET_MARKERLESS_MAX = 0.06   # DUET App. A.4: the realised marker-less rate 0.012-0.06
DARTS_TAIL_MIN = 5.0         # DARTS Sec. 1: the tail 5-10x the median length
DARTS_TRUNCATED_MIN = 0.05   # DARTS Sec. 4.3.1: tail pruning triggers for ~5% of prompts

ON, OFF, NO_EVIDENCE = "on", "off", "no evidence"

# The rows each verdict rests on (docs/benchmarks.md by section, or the paper where the
# project has no end-to-end run in that regime yet), by (technique, decision).
ROWS = {
    ("duet", OFF): "Time to accuracy: duet:gate -0.021 (-0.038 to -0.004) at equal time on "
                   "the first kit, 16% marker-less at the gate",
    ("duet", ON): "DUET Table 3: 2.51x at eps 0.05 (Qwen3-1.7B, MATH, 1.2-6% marker-less); "
                  "no end-to-end run on the reasoning kit yet",
    ("darts", OFF): "Time to accuracy: DARTS on top of DAS 1.12-1.15x against DAS's "
                    "1.20-1.27x on the first kit (response limit 256, 3.4% cut by it)",
    ("darts", ON): "DARTS Sec. 5.2: 1.29-1.77x over VeRL (Qwen 3B-32B, DAPO-MATH); no "
                   "end-to-end run on the reasoning kit yet",
    ("arrol", OFF): "ARRoL's gate: where steering helps (vllm-rl bench arrol-gate)",
    ("arrol", ON): "ARRoL's gate: where steering helps (vllm-rl bench arrol-gate)",
    ("arrol", NO_EVIDENCE): "ARRoL's gate: where steering helps (vllm-rl bench arrol-gate)",
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


def duet(r: Regime) -> Verdict:
    at_gate = (f"{_pct(r.markerless_at_gate)} of samples reach the gate K2 + G = {r.gate} "
               "with no marker")
    if r.markerless_at_gate > DUET_MARKERLESS_MAX:
        return _verdict("duet", OFF, f"{at_gate}, above the paper's 6% (App. A.4): its 1/eps "
                       "samples would carry a large share of each step")
    trim = (f"the trim removes the {_pct(r.share_after_first_answer)} of tokens written "
            "after the first answer" if r.share_after_first_answer > 0 else
            "no tokens come after the first answer: the trim saves nothing")
    return _verdict("duet", ON, f"{at_gate}, within the paper's 1.2-6% (App. A.4); {trim}")


def darts(r: Regime) -> Verdict:
    tail = r.length_p99 / max(r.length_p50, 1.0)
    cut = r.length_p99 >= r.max_tokens
    long_tail = (r.truncated >= DARTS_TRUNCATED_MIN if cut else tail >= DARTS_TAIL_MIN)
    ratio = (f"length p99/p50 {tail:.1f}x, p99 at the limit" if cut else
             f"length p99/p50 {tail:.1f}x (DARTS Sec. 1: 5-10x)")
    return _verdict(
        "darts", ON if long_tail else OFF,
        f"{ratio}; {_pct(r.truncated)} cut by the limit (~5%: Sec. 4.3.1); rho {r.rho:.2f}: "
        + ("the step waits for its tail" if long_tail else
           "the tail is too short for the extra samples to pay"))


def arrol(r: Regime) -> Verdict:
    from vllm_rl.arrol.controller import AUC_GATE

    if r.head_auc_within is None:
        return _verdict("arrol", NO_EVIDENCE, "no sample carries both a head score and a "
                       "reward (ARRoL flags at l_detect, rewards in the records)")
    ranks = r.head_auc_within >= AUC_GATE
    return _verdict("arrol", ON if ranks else OFF,
                   f"the head's within-group AUC {r.head_auc_within:.2f} over {r.scored} "
                   f"scored samples (pooled {r.head_auc:.2f}), the floor {AUC_GATE}: "
                   + ("it ranks within groups; the engine's steering gate decides each step"
                      if ranks else "it does not rank within groups; pruning would not steer"))


def das(r: Regime) -> Verdict:
    if r.draft_acceptance is None:
        return _verdict("das", ON, "no drafts in the records; DAS is lossless and its cost "
                       "cap drafts only where verification pays")
    return _verdict("das", ON, f"{r.draft_acceptance:.2f} accepted tokens per draft token "
                   f"over {r.draft_tokens} draft tokens; lossless, and its cost cap drafts "
                   "only where verification pays")


def verdicts(r: Regime) -> list[Verdict]:
    """Every technique's verdict, in the order the brief names them."""
    return [arrol(r), duet(r), das(r), darts(r)]
