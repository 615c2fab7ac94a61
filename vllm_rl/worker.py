"""The worker extension of vllm_rl engines (``worker_extension_cls``).

One class with every worker-side API: DAS trees (:mod:`vllm_rl.spec.worker`), the
ARRoL head (:mod:`vllm_rl.arrol.worker`) and weight reloads (:mod:`vllm_rl.weights`).  An RL framework with its own worker extension
(verl's weight sync, OpenRLHF's) lists this class among its bases.
"""
from __future__ import annotations

from vllm_rl.arrol.worker import ArrolWorkerExtension
from vllm_rl.spec.worker import DASWorkerExtension
from vllm_rl.weights import WeightsWorkerExtension


class RLWorkerExtension(DASWorkerExtension, ArrolWorkerExtension, WeightsWorkerExtension):
    """DAS tree, ARRoL head and weight-reload methods, reached with ``collective_rpc``."""
