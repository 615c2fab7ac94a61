"""The class paths vLLM resolves to build the RL engine: its scheduler (asynchronous, and
synchronous for the CPU platform and DAS's synchronous path) and its worker extension
(DAS's trees, ARRoL's head).  Strings, so naming them imports nothing; the package
re-exports them (``vllm_rl.SCHEDULER_CLS``)."""
from __future__ import annotations

SCHEDULER_CLS = "vllm_rl.engine.scheduler.RLScheduler"
SYNC_SCHEDULER_CLS = "vllm_rl.engine.scheduler.RLSyncScheduler"   # CPU platform; DAS sync
WORKER_EXTENSION_CLS = "vllm_rl.worker.RLWorkerExtension"   # DAS trees + ARRoL head

__all__ = ["SCHEDULER_CLS", "SYNC_SCHEDULER_CLS", "WORKER_EXTENSION_CLS"]
