"""The worker extension of verl's servers on the RL engine.

verl's ``vLLMColocateWorkerExtension`` does the weight sync (CUDA IPC / shared memory,
LoRA, FP8); :class:`vllm_rl.worker.RLWorkerExtension` holds the DAS trees and the ARRoL
head.  vLLM takes one ``worker_extension_cls``, so this class is both.
"""
from vllm_rl.compat import vllm_version_shim

vllm_version_shim()

from verl.workers.rollout.vllm_rollout.utils import vLLMColocateWorkerExtension  # noqa: E402

from vllm_rl.worker import RLWorkerExtension  # noqa: E402


class VerlRLWorkerExtension(vLLMColocateWorkerExtension, RLWorkerExtension):
    """verl's weight sync and vllm_rl's DAS / ARRoL methods on one worker."""
