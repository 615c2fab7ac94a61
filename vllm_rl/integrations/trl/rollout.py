"""TRL's ``rollout_func`` on the RL engine in the same process, and the records in the loss.

``GRPOTrainer(rollout_func=RolloutFunc(llm, flags), ...)``: TRL hands the function a
generation batch in which each prompt appears ``num_generations`` (= M) times in a row;
the function

1. loads the trainer's current weights into the engine when the step changed
   (:meth:`vllm_rl.LLM.load_weights`: vLLM's ``reload_weights``; the DAS trees, ARRoL
   head and DUET thresholds stay),
2. sends each distinct prompt once with ``n`` = M′ (``redundant``, default M) and the
   group's flags (``group.size`` = M, ``das.problem_id`` from ``problem_id(prompt)``),
3. returns M completions per prompt, the training group first (DARTS: the M selected;
   otherwise every sample), with the real tokens and log-probs, and per sample:

   * ``env_mask``: TRL multiplies it into the loss mask; all ones for a sample in the
     training group, all zeros for one that is not (DUET aborted, ARRoL pruned,
     DARTS cancelled or unselected when fewer than M were selectable);
   * ``vllm_rl_weight``: the record's loss weight (0 for those, 1/ε for DUET's
     ε-kept): :func:`masked_reward` makes TRL's reward ``None`` where it is 0, so TRL
     leaves the sample out of its group baseline and gives it zero advantage, and
     :class:`~vllm_rl.integrations.trl.trainer.RLGRPOTrainer` multiplies the
     advantages by it;
   * ``vllm_rl_record``: the :class:`~vllm_rl.outcome.RolloutInfo` wire string.

:attr:`RolloutFunc.last` keeps the last step's records (for the ARRoL head, DUET's
thresholds, the figures).
"""
from __future__ import annotations

import copy
import hashlib
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from vllm import SamplingParams

from vllm_rl.outcome import RolloutInfo

RECORD = "vllm_rl_record"
WEIGHT = "vllm_rl_weight"


def default_problem_id(prompt: str) -> str:
    return "p:" + hashlib.blake2b(prompt.encode(), digest_size=8).hexdigest()


@dataclass
class Rollout:
    """One step's rollout as the engine returned it (every sample, not only the M)."""

    prompts: list[str] = field(default_factory=list)
    infos: list[list[RolloutInfo]] = field(default_factory=list)     # per prompt, all M′
    texts: list[list[str]] = field(default_factory=list)
    generated_tokens: int = 0
    wall_s: float = 0.0


class RolloutFunc:
    """TRL ``rollout_func(prompts, trainer)`` on a :class:`vllm_rl.LLM` (module docstring)."""

    def __init__(self, llm, flags: dict[str, Any] | None = None, *, redundant: int | None = None,
                 max_tokens: int = 256, temperature: float = 1.0, seed: int = 0,
                 problem_id: Callable[[str], str] = default_problem_id,
                 sync_weights: bool = True) -> None:
        self.llm, self.flags = llm, copy.deepcopy(flags) if flags else None
        self.redundant, self.max_tokens, self.temperature = redundant, max_tokens, temperature
        self.seed, self.problem_id, self.sync_weights = seed, problem_id, sync_weights
        self.loaded_step: int | None = None
        self.calls = 0
        self.last = Rollout()
        self.last_weights: list[float] = []     # per returned sample, in TRL's order

    def _params(self, prompt: str, m: int) -> SamplingParams:
        from vllm_rl import rl_params

        n = max(self.redundant or m, m)
        extra = None
        if self.flags is not None:
            flags = copy.deepcopy(self.flags)
            flags.setdefault("group", {})["size"] = m
            if "das" in flags:
                flags["das"].setdefault("problem_id", self.problem_id(prompt))
            extra = rl_params(**flags)
        seed = self.seed * 1_000_003 + self.calls * 10_007 + int(
            hashlib.blake2b(prompt.encode(), digest_size=4).hexdigest(), 16) % 10_007
        return SamplingParams(n=n, temperature=self.temperature, max_tokens=self.max_tokens,
                              logprobs=0, seed=seed, extra_args=extra)

    def load(self, trainer) -> None:
        """The trainer's weights into the engine, once per optimizer step."""
        step = trainer.state.global_step
        if self.sync_weights and step != self.loaded_step:
            from vllm_rl.weights import load_weights

            model = trainer.accelerator.unwrap_model(trainer.model)
            load_weights(self.llm, {k: v.detach() for k, v in model.state_dict().items()})
            self.loaded_step = step

    def __call__(self, prompts: Sequence[Any], trainer) -> dict[str, list]:
        import time

        self.load(trainer)
        distinct, counts = [], []
        for p in prompts:
            if distinct and p == distinct[-1]:
                counts[-1] += 1
            else:
                distinct.append(p)
                counts.append(1)
        t0 = time.perf_counter()
        outs = self.llm.generate(list(distinct), [self._params(p, m) for p, m in zip(distinct, counts)],
                                 use_tqdm=False)
        wall = time.perf_counter() - t0
        self.calls += 1
        result: dict[str, list] = {k: [] for k in ("prompt_ids", "completion_ids", "logprobs",
                                                   "env_mask", WEIGHT, RECORD)}
        self.last = Rollout(prompts=list(distinct), wall_s=wall)
        for out, m in zip(outs, counts):
            comps = list(out.outputs)
            infos = [getattr(c, "rollout_info", None) or RolloutInfo.from_completion(c)
                     for c in comps]
            self.last.infos.append(infos)
            self.last.texts.append([c.text for c in comps])
            self.last.generated_tokens += sum(len(c.token_ids) for c in comps)
            order = sorted(range(len(comps)), key=lambda i: _rank(infos[i]))[:m]
            for i in order:
                c, info = comps[i], infos[i]
                weight = _weight(info)
                ids = list(c.token_ids)
                result["prompt_ids"].append(list(out.prompt_token_ids))
                result["completion_ids"].append(ids)
                result["logprobs"].append([lp[t].logprob for lp, t in zip(c.logprobs or [], ids)]
                                          if c.logprobs else [0.0] * len(ids))
                result["env_mask"].append([1 if weight > 0 else 0] * len(ids))
                result[WEIGHT].append(weight)
                result[RECORD].append(info.encode())
        self.last_weights = list(result[WEIGHT])
        return result


def _weight(info: RolloutInfo) -> float:
    if info.selected is False:
        return 0.0
    return float(info.weight)


def _rank(info: RolloutInfo) -> tuple:
    """Training group first: selected (DARTS), then by weight > 0, then engine order."""
    return (info.selected is False, _weight(info) <= 0)


def masked_reward(fn: Callable[..., list[float]]) -> Callable[..., list[float | None]]:
    """A TRL reward function that returns ``None`` for samples outside the training group
    (``vllm_rl_weight`` 0): TRL then leaves them out of the group baseline and gives them
    zero advantage."""
    def reward(prompts, completions, **kwargs):
        values = fn(prompts, completions, **kwargs)
        weights = kwargs.get(WEIGHT) or [1.0] * len(values)
        return [None if w <= 0 else v for v, w in zip(values, weights)]

    reward.__name__ = getattr(fn, "__name__", "reward")
    return reward
