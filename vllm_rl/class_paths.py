"""The names that make a vLLM engine the RL engine: the class paths vLLM resolves (its
scheduler, asynchronous, and synchronous for the CPU platform and DAS's synchronous path;
its worker extension: DAS's trees, ARRoL's head) and the environment variable that asks
for vllm_rl's patches in the engine's processes (:data:`ENGINE_ENV`).  Strings, so naming
them imports nothing; the package re-exports the class paths (``vllm_rl.SCHEDULER_CLS``)."""
from __future__ import annotations

SCHEDULER_CLS = "vllm_rl.engine.scheduler.RLScheduler"
SYNC_SCHEDULER_CLS = "vllm_rl.engine.scheduler.RLSyncScheduler"   # CPU platform; DAS sync
WORKER_EXTENSION_CLS = "vllm_rl.worker.RLWorkerExtension"   # DAS trees + ARRoL head
# "1" in the environment of a process that builds the RL engine: vLLM's general plugin
# (vllm_rl.plugin) applies the patches only there.  The engine's factories set it, and its
# processes inherit it (vLLM copies VLLM_* variables to Ray actors too).
ENGINE_ENV = "VLLM_RL_ENGINE"


def patches_asked() -> bool:
    """Whether this process was asked for vllm_rl's patches (:data:`ENGINE_ENV` is "1")."""
    import os

    return os.environ.get(ENGINE_ENV) == "1"

__all__ = ["ENGINE_ENV", "SCHEDULER_CLS", "SYNC_SCHEDULER_CLS", "WORKER_EXTENSION_CLS",
           "patches_asked"]
