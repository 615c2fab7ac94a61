"""The RL state on a framework's rollout actor: one async method per RPC of the table.

Both drop-in actors (verl's ``RLHttpServer``, OpenRLHF's ``RLRolloutActor``) own an
engine and expose the worker extension's methods (:data:`vllm_rl.rpc.METHODS`) with their
results, through ``async rl_rpc(method, args)``, which each actor defines on its own
engine handle.
"""
from __future__ import annotations

from vllm_rl.rpc import METHODS


class RLStateRPC:
    """``das_*`` and ``arrol_*`` on an actor that defines ``async rl_rpc(method, args)``."""


for _method in METHODS:
    async def _call(self, *args, _m=_method, **kwargs):
        return await self.rl_rpc(_m.name, _m.call_args(*args, **kwargs))

    _call.__name__ = _call.__qualname__ = _method.name
    _call.__doc__ = _method.doc
    setattr(RLStateRPC, _method.name, _call)
del _method, _call

__all__ = ["RLStateRPC"]
