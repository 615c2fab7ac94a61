"""The RL state on a framework's rollout actor: one async method per RPC of the table.

Both drop-in actors (verl's ``RLHttpServer``, OpenRLHF's ``RLRolloutActor``) own an
engine and expose the worker extension's methods (:data:`vllm_rl.rpc.METHODS`) with their
results.  :class:`RLStateRPC` writes each out; every call's arguments go through the
table's checks (:meth:`vllm_rl.rpc.Method.engine_call_args`: a bad ARRoL head or
calibration is a ``ValueError`` on the actor, against the engine's head and hidden size
once the engine runs), then through ``async rl_rpc(method, args)``, which each actor
defines on its own engine handle.
"""
from __future__ import annotations

from typing import Any, Sequence

from vllm_rl.rpc import BY_NAME


class RLStateRPC:
    """``das_*`` and ``arrol_*`` on an actor that defines ``async rl_rpc(method, args)``
    (and, to check against the engine, :meth:`rl_vllm_config`)."""

    async def rl_rpc(self, method: str, args: tuple = ()) -> Any:
        """The worker method ``method`` with ``args`` on every rank; rank 0's answer.
        Each actor implements it on its engine (``collective_rpc``)."""
        raise NotImplementedError(f"{type(self).__name__} does not define rl_rpc")

    def rl_vllm_config(self) -> Any:
        """The engine's ``VllmConfig`` for the checks that need it (an ARRoL head's hidden
        size), or None (before the engine starts): the engine-free checks only."""
        return None

    async def _rl_call(self, method: str, *args: Any) -> Any:
        m = BY_NAME[method]
        args = m.engine_call_args(self.rl_vllm_config(), *args)
        return m.read(await self.rl_rpc(m.name, args))

    async def das_prebuild(self, problem_id: str, rollouts: Sequence[Sequence[int]],
                           prompt_token_ids: Sequence[int] | None = None) -> int:
        """Fill a problem's DAS tree with past rollouts (output token ids); returns how
        many were added."""
        return await self._rl_call("das_prebuild", problem_id, rollouts, prompt_token_ids)

    async def das_clear(self, problem_id: str | None = None) -> int:
        """Drop one problem's DAS tree, or every tree (``None``); returns how many were
        dropped."""
        return await self._rl_call("das_clear", problem_id)

    async def das_stats(self) -> dict[str, Any]:
        """The DAS drafter's trees, memory, and acceptance (totals and per step)."""
        return await self._rl_call("das_stats")

    async def das_phase(self) -> list[dict[str, Any]]:
        """The drafter's recent phase-aware decisions (``batch_cap="phase"``)."""
        return await self._rl_call("das_phase")

    async def arrol_update(self, head: Any = None, calibration: Any = None,
                           cold_start: bool = False, version: int | None = None) -> int:
        """Load ARRoL head weights and/or a calibration between steps (``cold_start=True``:
        scoring without pruning), checked before any worker sees them; returns the head
        version every record scored from the next step on names."""
        return await self._rl_call("arrol_update", head, calibration, cold_start, version)

    async def arrol_info(self) -> dict[str, Any]:
        """ARRoL's head: version, shape, calibration, samples scored and pruned."""
        return await self._rl_call("arrol_info")

    async def arrol_hidden(self, request_ids: Sequence[str]) -> dict[str, Any]:
        """Take the hidden states at ``l_detect`` kept on the workers for these records
        (their ``hidden_id``): request id -> float32 numpy vector, ids not kept absent."""
        return await self._rl_call("arrol_hidden", request_ids)


__all__ = ["RLStateRPC"]
