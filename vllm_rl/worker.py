"""The worker extension of vllm_rl engines (``worker_extension_cls``).

One class with every worker-side API: the RL state's methods of the one RPC table
(:data:`vllm_rl.rpc.METHODS`: DAS trees, :mod:`vllm_rl.das.worker`; the ARRoL head and
its kept hidden states, :mod:`vllm_rl.arrol.worker`) and weight reloads
(:mod:`vllm_rl.weights`).  An RL framework with its own worker extension (verl's weight
sync, OpenRLHF's) lists this class among its bases.
"""
from __future__ import annotations

from vllm_rl.arrol.worker import ArrolWorkerExtension
from vllm_rl.das.worker import DASWorkerExtension
from vllm_rl.weights import WeightsWorkerExtension


class RLWorkerExtension(DASWorkerExtension, ArrolWorkerExtension, WeightsWorkerExtension):
    """The RPC table's worker methods (``das_prebuild``, ``das_clear``, ``das_stats``,
    ``das_phase`` from :class:`~vllm_rl.das.worker.DASWorkerExtension`; ``arrol_update``,
    ``arrol_info``, ``arrol_hidden`` from :class:`~vllm_rl.arrol.worker.ArrolWorkerExtension`)
    and weight reloads (:class:`~vllm_rl.weights.WeightsWorkerExtension`), reached with
    ``collective_rpc``."""


__all__ = ["RLWorkerExtension"]
