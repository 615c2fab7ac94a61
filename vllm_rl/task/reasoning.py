"""The reasoning-regime task: the same arithmetic, written the way a reasoning model writes.

The problems are :mod:`vllm_rl.task.problems`'s with more operations (``OPS``), and the
verifier is the same (the last closed ``\\boxed{...}`` counts).  The teacher traces the
reasoning model is trained on answer first and then keep checking:

* the first pass computes the chain (each step wrong with ``STEP_ERROR``) and writes
  ``so \\boxed{ v }``: the answer comes early, as DUET's marker (App. A.4) expects;
* then ``wait again``: the chain is redone, sloppier (``CHECK_ERROR``), and the pass ends
  with ``ok`` or ``no`` and the answer again; on ``no`` the writer switches to the new
  value with ``SWITCH``: the overthinking DUET's trim acts on, which sometimes changes
  the answer;
* after agreeing it stops with ``STOP_AGREE``, after disagreeing only with
  ``STOP_DISAGREE``, so long traces are the confused ones and more often wrong (DARTS's
  Pattern I, *ineffective verbosity*);
* with ``POST_RUMINATE`` the checking never stops and runs into the response limit
  (``RESPONSE_LIMIT``); with ``PRE_RUMINATE`` the trace ruminates (``hmm``) before any
  answer and reaches the limit with no marker (what DUET's gate aborts);
* every sample of a problem repeats the same step strings (what DAS's trees feed on).

The regime statistics are those of the trained model's samples (``vllm-rl bench
regime``), not these settings.
"""
from __future__ import annotations

import random

from .problems import MAX_VALUE, Problem, _noisy

OPS = (4, 10)            # operations per problem (the first kit has 2 to 7)
RESPONSE_LIMIT = 1024    # the response limit the kit is trained and benchmarked at
MAX_MODEL_LEN = 1088     # prompt (at most 24 tokens) + the response limit, rounded up
L_DETECT = 64            # ARRoL's l_detect: 1/16 of the limit, as 512 of 8,192 (Sec. 5.1)

STEP_ERROR = 0.06        # a step of the first pass is wrong
CHECK_ERROR = 0.08       # a step of a checking pass is wrong
SWITCH = 0.6             # after a disagreeing check, the answer changes to the check's
STOP_AGREE = 0.4         # stop after a check that agreed
STOP_DISAGREE = 0.1      # stop after a check that disagreed
POST_RUMINATE = 0.05     # keep checking until the limit
PRE_RUMINATE = 0.04      # ruminate before any answer until the limit

assert MAX_VALUE == 99


def _chain(problem: Problem, p_err: float, rng: random.Random, parts: list[str]) -> int:
    value = problem.start
    for op, d in problem.ops:
        new = _noisy(value, op, d, p_err, rng)
        parts.append(f"{value} {op} {d} = {new} ;")
        value = new
    return value


def _words(parts: list[str]) -> int:
    return sum(part.count(" ") + 1 for part in parts)


def teacher_trace(problem: Problem, rng: random.Random,
                  limit: int = RESPONSE_LIMIT) -> tuple[str, bool]:
    """One sampled reasoning trace and whether it ends by itself (else it runs past
    ``limit`` words, one token each, and is cut there in training)."""
    parts: list[str] = []
    if rng.random() < PRE_RUMINATE:
        while _words(parts) <= limit:
            parts.append("hmm")
            _chain(problem, CHECK_ERROR, rng, parts)
        return " ".join(parts), False
    answer = _chain(problem, STEP_ERROR, rng, parts)
    parts.append(f"so \\boxed{{ {answer} }}")
    forever = rng.random() < POST_RUMINATE
    while True:
        parts.append("wait again")
        check = _chain(problem, CHECK_ERROR, rng, parts)
        agree = check == answer
        if not agree and rng.random() < SWITCH:
            answer = check
        parts.append(f"{'ok' if agree else 'no'} so \\boxed{{ {answer} }}")
        if forever:
            if _words(parts) > limit:
                return " ".join(parts), False
        elif rng.random() < (STOP_AGREE if agree else STOP_DISAGREE):
            return " ".join(parts), True
