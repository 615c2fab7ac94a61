"""The worker extension of vllm_rl engines (``worker_extension_cls``).

One class with every worker-side API: the RL state's methods of the one RPC table
(:data:`vllm_rl.rpc.METHODS`: DAS trees, :mod:`vllm_rl.das.worker`; the ARRoL head,
:mod:`vllm_rl.arrol.worker`) and weight reloads (:mod:`vllm_rl.weights`).  An RL framework
with its own worker extension (verl's weight sync, OpenRLHF's) lists this class among
its bases.
"""
from __future__ import annotations

from vllm_rl.rpc import owners
from vllm_rl.weights import WeightsWorkerExtension

RLWorkerExtension = type("RLWorkerExtension", (*owners(), WeightsWorkerExtension), {
    "__module__": __name__,
    "__doc__": "The RPC table's worker methods and weight reloads, reached with "
               "``collective_rpc``."})

__all__ = ["RLWorkerExtension"]
