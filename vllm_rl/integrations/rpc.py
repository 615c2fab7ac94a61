"""The RL state on a framework's rollout actor: DAS trees and the ARRoL head.

Both drop-in actors (verl's ``RLHttpServer``, OpenRLHF's ``RLRolloutActor``) own an
engine and expose the worker extension's methods (:class:`vllm_rl.worker.RLWorkerExtension`)
with their results, through :meth:`RLStateRPC.rl_rpc`, which each actor defines on its
own engine handle.
"""
from __future__ import annotations


class RLStateRPC:
    """``das_*`` and ``arrol_*`` on an actor that defines ``async rl_rpc(method, args)``."""

    async def das_stats(self) -> dict:
        return await self.rl_rpc("das_stats")

    async def das_prebuild(self, problem_id: str, rollouts, prompt_token_ids=None) -> int:
        rollouts = [list(map(int, r)) for r in rollouts]
        prompt = None if prompt_token_ids is None else list(map(int, prompt_token_ids))
        return await self.rl_rpc("das_prebuild", (problem_id, rollouts, prompt))

    async def das_clear(self, problem_id: str | None = None) -> int:
        return await self.rl_rpc("das_clear", (problem_id,))

    async def arrol_update(self, head=None, calibration=None, cold_start: bool = False,
                           version: int | None = None) -> int:
        return await self.rl_rpc("arrol_update", (head, calibration, cold_start, version))

    async def arrol_info(self) -> dict:
        return await self.rl_rpc("arrol_info")
