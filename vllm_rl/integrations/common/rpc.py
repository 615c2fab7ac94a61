"""The RL state on a framework's rollout actor: one async method per RPC of the table.

Both drop-in actors (verl's ``RLHttpServer``, OpenRLHF's ``RLRolloutActor``) own an
engine and expose the worker extension's methods (:data:`vllm_rl.rpc.METHODS`) with their
results.  :class:`RLStateRPC` gets each from the table (:func:`vllm_rl.rpc.rpc_methods`);
every call's arguments go through the table's checks (:meth:`vllm_rl.rpc.Method.engine_call_args`: a bad ARRoL head or
calibration is a ``ValueError`` on the actor, against the engine's head and hidden size
once the engine runs), then through ``async rl_rpc(method, args)``, which each actor
defines on its own engine handle.
"""
from __future__ import annotations

from typing import Any

from vllm_rl.rpc import BY_NAME, rpc_methods


@rpc_methods(is_async=True)
class RLStateRPC:
    """``das_*`` and ``arrol_*`` on an actor that defines ``async rl_rpc(method, args)``
    (and, to check against the engine, :meth:`rl_vllm_config`)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Every actor class names its ``async rl_rpc(method, args)``: the worker method
        ``method`` with ``args`` on every rank, rank 0's answer (its engine's
        ``collective_rpc``).  A class without one is refused when it is defined."""
        super().__init_subclass__(**kwargs)
        if not callable(getattr(cls, "rl_rpc", None)):
            raise TypeError(f"{cls.__name__} mixes in RLStateRPC without defining "
                            "async rl_rpc(method, args)")

    def rl_vllm_config(self) -> Any:
        """The engine's ``VllmConfig`` for the checks that need it (an ARRoL head's hidden
        size), or None (before the engine starts): the engine-free checks only."""
        return None

    async def _rl_call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """One table method (the ``das_*`` / ``arrol_*`` methods, generated from
        :data:`vllm_rl.rpc.METHODS`): its arguments checked, then :meth:`rl_rpc`."""
        m = BY_NAME[method]
        args = m.engine_call_args(self.rl_vllm_config(), *args, **kwargs)
        return m.read(await self.rl_rpc(m.name, args))


__all__ = ["RLStateRPC"]
