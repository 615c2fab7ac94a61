"""The two kits, each selected by one name: a model, its prompt sets, its teacher and limits.

* ``arith``: the first kit (:mod:`vllm_rl.task.problems`): short chains, the answer is
  the last thing a sample writes, responses of at most a few hundred tokens.  The suite,
  the demo and the main benchmarks use it.
* ``reasoning``: the reasoning-regime kit (:mod:`vllm_rl.task.reasoning`): longer
  chains, the answer written early and then checked again and again, a response limit of
  1,024 tokens that a share of samples reaches.

Both share the verifier (:func:`vllm_rl.task.problems.reward`) and the tokenizer.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from . import problems, reasoning

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Kit:
    name: str
    model_path: Path
    ops: problems.Ops                 # operations per problem
    max_tokens: int                   # the response limit its benchmarks sample at
    max_model_len: int                # the engine's context length for it
    teacher: Callable                 # (problem, rng) -> (trace, ends)
    completion_cap: int               # teacher traces are cut here in training
    l_detect: int                     # ARRoL's detection length on it

    def heldout_prompts(self, n: int = 64) -> list[str]:
        return problems.heldout_prompts(n, self.ops)

    def train_prompts(self, n: int = 4096) -> list[str]:
        return problems.train_prompts(n, self.ops)

    def outside_prompts(self, seed: int, n: int, pool: int = 4096) -> list[str]:
        return problems.outside_prompts(seed, n, pool, self.ops)

    def heldout_problems(self, n: int = 64) -> list[problems.Problem]:
        return problems.heldout_problems(n, self.ops)

    def train_problems(self, n: int = 4096) -> list[problems.Problem]:
        return problems.train_problems(n, self.ops)

    @staticmethod
    def reward(prompt: str, completion: str) -> float:
        return problems.reward(prompt, completion)


KITS: dict[str, Kit] = {
    "arith": Kit("arith", HERE / "model", problems.ARITH_OPS, max_tokens=256,
                 max_model_len=512, teacher=problems.teacher_trace, completion_cap=320,
                 l_detect=24),
    "reasoning": Kit("reasoning", HERE / "reasoning_model", reasoning.OPS,
                     max_tokens=reasoning.RESPONSE_LIMIT, max_model_len=reasoning.MAX_MODEL_LEN,
                     teacher=reasoning.teacher_trace, completion_cap=reasoning.RESPONSE_LIMIT,
                     l_detect=reasoning.L_DETECT),
}
DEFAULT = "arith"


def add_argument(ap) -> None:
    """A benchmark's ``--task``: the kit it runs on (its defaults follow the kit's)."""
    ap.add_argument("--task", default=DEFAULT, choices=list(KITS),
                    help="the kit: 'arith' (the first: short answers last, limit 256) or "
                         "'reasoning' (the answer early, then rechecks; limit 1,024) "
                         f"(default {DEFAULT})")


def kit(name: str = DEFAULT) -> Kit:
    """The kit called ``name`` (``arith`` or ``reasoning``)."""
    try:
        return KITS[name]
    except KeyError:
        raise ValueError(f"no kit {name!r}; the kits are {', '.join(KITS)}") from None
