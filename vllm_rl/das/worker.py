"""DAS tree API on the worker: prebuild, clear, stats, phase (``worker_extension_cls``).

A DAS engine's trees live in its drafter, inside the worker process.  vLLM's
``worker_extension_cls`` adds these methods to the worker so the client reaches them
with ``collective_rpc`` (``vllm_rl.LLM.das_prebuild`` / ``das_clear`` / ``das_stats`` do
it for you).  An RL framework with its own worker extension (verl's weight sync, for
one) lists this class among its bases.
"""
from __future__ import annotations

from typing import Any, Sequence


class DASWorkerExtension:
    def _das(self):
        drafter = getattr(getattr(self, "model_runner", None), "drafter", None)
        if drafter is None or not hasattr(drafter, "store"):
            raise RuntimeError("this engine was started without the DAS drafter "
                               "(use vllm_rl.LLM(das=True))")
        drafter.settle()                # the last step's background feed, done first
        return drafter

    def das_prebuild(self, problem_id: str, rollouts: Sequence[Sequence[int]],
                     prompt_token_ids: Sequence[int] | None = None) -> int:
        """Add finished rollouts (output token ids) of one problem to its tree."""
        return self._das().prebuild(problem_id, rollouts, prompt_token_ids)

    def das_clear(self, problem_id: str | None = None) -> int:
        """Drop one problem's tree, or every tree; returns how many were dropped."""
        return self._das().clear(problem_id)

    def das_stats(self) -> dict[str, Any]:
        """Trees, memory, and acceptance: totals and per verification step."""
        return self._das().stats()

    def das_phase(self) -> list[dict[str, Any]]:
        """The drafter's recent phase-aware decisions (``batch_cap="phase"``): per step the
        batch, mean context, and per drafting request its acceptance estimate, draft cap
        and chosen length."""
        return self._das().phase()
