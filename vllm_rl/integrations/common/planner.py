"""DARTS's per-prompt plan for a step: redundancy M'_i (Alg. 1) and sampling mode (Alg. 2).

:class:`DartsPlanner` keeps each prompt's smoothed length variance
(:class:`vllm_rl.control.darts.LengthStats`, Sec. 4.2.2) and, for a step's prompts,

1. sets the total redundancy ``M_total = round(budget * M * N)`` (App. B's typical
   1.5 MN by default; :func:`vllm_rl.control.darts.adaptive_budget` gives Eq. 8-9's
   when a cost slope is known),
2. splits it with Alg. 1 over ``[M_low, M_up] = [M, 2M]`` by the normalised std
   (:func:`vllm_rl.control.darts.allocate`),
3. gives each prompt Alg. 2's mode: dual-end (K = M − 1 shortest + L = 1 longest valid)
   while M'_i < M_up; **shortest-only with proactive early stop only where the
   allocation saturates**, M'_i = M_up (Sec. 4.3.1: "we ... treat the saturation of the
   budget (M'_i = M_up) as a proxy for severe long-tail characteristics").

Prompts never seen get the dataset-level std, so the first epoch is a uniform split
(no saturation unless the budget is the full 2MN).  :meth:`observe` takes a step's
lengths per prompt (every sample, early-ended ones with their partial length: Sec. 4.2.2
uses the whole M'_i).
"""
from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence

from vllm_rl.control.darts import LengthStats, PromptPlan, allocate, sampling_mode


class DartsPlanner:
    """Per-prompt M'_i and mode for each step (module docstring)."""

    def __init__(self, M: int, budget: float = 1.5, K: int | None = None,
                 stats: LengthStats | None = None) -> None:
        if not 1.0 <= budget <= 2.0:
            raise ValueError(f"DartsPlanner budget={budget!r}: allowed a float in [1, 2] "
                             "(M_total / (M N), Eq. 9's range)")
        self.M, self.budget = int(M), float(budget)
        self.K = self.M - 1 if K is None else int(K)
        self.stats = stats or LengthStats()

    def plan(self, prompt_ids: Sequence[Hashable]) -> list[PromptPlan]:
        ids = list(prompt_ids)
        m_up = 2 * self.M
        total = min(len(ids) * m_up, max(len(ids) * self.M,
                                         round(self.budget * self.M * len(ids))))
        counts = allocate([self.stats.std(pid) for pid in ids], total, self.M, m_up)
        return [PromptPlan(pid, m, self.M, sampling_mode(m, m_up), self.K, m_up)
                for pid, m in zip(ids, counts)]

    def flags(self, plan: PromptPlan) -> dict:
        """The ``darts`` and ``group`` sections for a plan (``rl_params`` keywords)."""
        return {"group": {"size": plan.size, "redundant": plan.n},
                "darts": {"mode": plan.mode, "k": plan.k, "m_up": plan.m_up}}

    def observe(self, lengths_by_prompt: Mapping[Hashable, Iterable[int]]) -> None:
        self.stats.update_step({k: list(v) for k, v in lengths_by_prompt.items() if v})
