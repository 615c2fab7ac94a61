"""The embedded task: chained small-integer arithmetic with a verifiable boxed answer.

A problem is a start value and ``k`` operations (``+ d`` or ``- d``) whose running total
stays in ``[0, 99]``.  The prompt reads ``compute 37 + 5 - 8 + 9 :`` and a completion is
step-by-step work ending in ``\\boxed{ N }``.

The teacher traces the policy is trained on are deliberately *noisy reasoning*, so the
trained model behaves like an RL policy rather than a calculator:

* each step is wrong with a small probability (answers are mixed within a group);
* after a step the writer may "wait" and recheck it; a recheck is itself error-prone, so
  verbose traces are more often wrong (DARTS Pattern I, *ineffective verbosity*);
* with a small probability a trace *ruminates*: it redoes the whole chain again and again
  and usually runs into the length limit (the intra-prompt long tail);
* problems with more operations need longer work (DARTS Pattern II);
* all samples of one problem repeat the same step strings (what a suffix-tree drafter
  feeds on).
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass

from vllm_rl.duet.markers import BOXED_PATTERN

EOS = "<|endoftext|>"
MAX_VALUE = 99
MIN_OPS, MAX_OPS = 2, 7
Ops = tuple[int, int]          # the fewest and most operations of a problem
ARITH_OPS: Ops = (MIN_OPS, MAX_OPS)

# Teacher-trace knobs (the defaults the shipped model was trained with).
STEP_ERROR = 0.05        # probability that a fresh step is computed wrong
WAIT_PROB = 0.25         # probability of a recheck after a step
WAIT_AGAIN = 0.45        # probability of one more recheck after a recheck
RECHECK_ERROR = 0.25     # a recheck is sloppier than a fresh step
RUMINATE_PROB = 0.25     # probability the trace redoes the whole chain over and over
RUMINATE_AGAIN = 0.88    # probability of one more pass while ruminating

_BOXED = re.compile(r"\\boxed\{\s*(-?\d+)\s*\}")
ANSWER_PATTERN = BOXED_PATTERN     # the kits' answer as DUET's user pattern


@dataclass(frozen=True)
class Problem:
    start: int
    ops: tuple[tuple[str, int], ...]

    @property
    def prompt(self) -> str:
        body = " ".join(f"{op} {d}" for op, d in self.ops)
        return f"compute {self.start} {body} :"

    @property
    def answer(self) -> int:
        value = self.start
        for op, d in self.ops:
            value = _apply(value, op, d)
        return value


def _apply(value: int, op: str, d: int) -> int:
    return value + d if op == "+" else value - d


def random_problem(rng: random.Random, ops: Ops = ARITH_OPS) -> Problem:
    """A problem with ``ops[0]`` to ``ops[1]`` operations, its running total in [0, 99]."""
    k = rng.randint(*ops)
    value = rng.randint(10, MAX_VALUE)
    start, chain = value, []
    for _ in range(k):
        d = rng.randint(2, 9)
        choices = [o for o in "+-" if 0 <= _apply(value, o, d) <= MAX_VALUE]
        op = rng.choice(choices)
        value = _apply(value, op, d)
        chain.append((op, d))
    return Problem(start, tuple(chain))


def parse_prompt(prompt: str) -> Problem:
    words = prompt.replace(EOS, " ").split()
    if len(words) < 3 or words[0] != "compute" or words[-1] != ":":
        raise ValueError(f"not a task prompt: {prompt!r}")
    nums = words[1:-1]
    ops = tuple((nums[i], int(nums[i + 1])) for i in range(1, len(nums) - 1, 2))
    return Problem(int(nums[0]), ops)


def _noisy(value: int, op: str, d: int, p_err: float, rng: random.Random) -> int:
    right = _apply(value, op, d)
    if rng.random() >= p_err:
        return right
    wrong = right + rng.choice((-3, -2, -1, 1, 2, 3))
    return min(MAX_VALUE, max(0, wrong)) if wrong != right else right + 1


def teacher_trace(problem: Problem, rng: random.Random) -> tuple[str, bool]:
    """One sampled teacher completion and whether it ends (else it is cut by length)."""
    parts: list[str] = []
    value = problem.start
    for op, d in problem.ops:
        new = _noisy(value, op, d, STEP_ERROR, rng)
        parts.append(f"{value} {op} {d} = {new} ;")
        if rng.random() < WAIT_PROB:
            while True:
                again = _noisy(value, op, d, RECHECK_ERROR, rng)
                parts.append(f"wait {value} {op} {d} = {again} {'ok' if again == new else 'no'} ;")
                new = again
                if rng.random() >= WAIT_AGAIN:
                    break
        value = new
    if rng.random() < RUMINATE_PROB:
        while True:
            value = problem.start
            parts.append("hmm again")
            for op, d in problem.ops:
                value = _noisy(value, op, d, RECHECK_ERROR, rng)
                parts.append(f"= {value}")
            parts.append(";")
            if rng.random() >= RUMINATE_AGAIN:
                break
    parts.append(f"so \\boxed{{ {value} }}")
    return " ".join(parts), True


def extract_answer(completion: str) -> int | None:
    """The integer inside the last closed ``\\boxed{...}``, or None."""
    found = _BOXED.findall(completion)
    return int(found[-1]) if found else None


def reward(prompt: str, completion: str) -> float:
    """Verifier: 1.0 if the completion's boxed answer equals the problem's answer."""
    got = extract_answer(completion)
    return float(got is not None and got == parse_prompt(prompt).answer)


def _problem_set(seed: int, n: int, exclude: set[Problem] | None = None,
                 ops: Ops = ARITH_OPS) -> list[Problem]:
    rng, out, seen = random.Random(seed), [], set(exclude or ())
    while len(out) < n:
        p = random_problem(rng, ops)
        if p not in seen:
            seen.add(p)
            out.append(p)
    return out


HELDOUT_SEED, TRAIN_SEED = 1234, 42


def heldout_problems(n: int = 64, ops: Ops = ARITH_OPS) -> list[Problem]:
    """The fixed held-out set (never trained on) of problems with ``ops`` operations."""
    return _problem_set(HELDOUT_SEED, n, ops=ops)


def train_problems(n: int = 4096, ops: Ops = ARITH_OPS) -> list[Problem]:
    """RL training prompts, disjoint from the held-out set."""
    return _problem_set(TRAIN_SEED, n, exclude=set(heldout_problems(256, ops)), ops=ops)


def heldout_prompts(n: int = 64, ops: Ops = ARITH_OPS) -> list[str]:
    return [p.prompt for p in heldout_problems(n, ops)]


def outside_prompts(seed: int, n: int, pool: int = 4096, ops: Ops = ARITH_OPS) -> list[str]:
    """``n`` prompts drawn with ``seed`` outside the training pool (``train_problems(pool)``)
    and the fixed held-out set: prompts no default was chosen on and no run trains on."""
    exclude = set(train_problems(pool, ops)) | set(heldout_problems(256, ops))
    return [p.prompt for p in _problem_set(seed, n, exclude, ops)]


def train_prompts(n: int = 4096, ops: Ops = ARITH_OPS) -> list[str]:
    return [p.prompt for p in train_problems(n, ops)]
