"""The worker extension of OpenRLHF's rollout engines on the RL engine.

OpenRLHF's ``WorkerWrap`` receives the trainer's weights (NCCL broadcast or CUDA IPC, one
parameter per call) and loads each with ``model_runner.model.load_weights``;
:class:`vllm_rl.worker.RLWorkerExtension` holds the DAS trees, the ARRoL head and
vllm_rl's weight reloads.  vLLM takes one ``worker_extension_cls``, so this class is both.

vLLM 0.32 refuses a direct ``model.load_weights`` once the model is loaded (the loaded
layers have dropped their ``weight_loader``; OpenRLHF 0.11.2 was written for vLLM 0.29).
Here each received parameter is kept, and the whole set is loaded at once through vLLM's
own ``reload_weights`` when the last one arrives: OpenRLHF's ``broadcast_to_vllm`` marks
the last parameter of a sync with ``empty_cache=True``.  ``vllm_rl_flush_weights`` loads
what is pending (for a sync that ends otherwise).  The receiving itself (NCCL, CUDA IPC)
is OpenRLHF's, unchanged: GPU only.
"""
from __future__ import annotations

from vllm_rl.compat import vllm_version_shim

vllm_version_shim()

from openrlhf.trainer.ray.vllm_worker_wrap import WorkerWrap  # noqa: E402

from vllm_rl.worker import RLWorkerExtension  # noqa: E402

WORKER_EXTENSION = "vllm_rl.integrations.openrlhf.worker.OpenRLHFRLWorkerExtension"


class _Collect:
    """Stands in for ``model_runner.model`` while OpenRLHF's method runs: its
    ``load_weights`` keeps the pairs; everything else is the model's."""

    def __init__(self, model, pending: list) -> None:
        self._model, self._pending = model, pending

    def load_weights(self, weights):
        self._pending.extend(weights)
        return set()

    def __getattr__(self, name):
        return getattr(self._model, name)


class OpenRLHFRLWorkerExtension(WorkerWrap, RLWorkerExtension):
    """OpenRLHF's weight sync and vllm_rl's DAS / ARRoL / reload methods on one worker."""

    def _vllm_rl_pending(self) -> list:
        if not hasattr(self, "_vllm_rl_weights"):
            self._vllm_rl_weights = []
        return self._vllm_rl_weights

    def _collecting(self, receive, *args, empty_cache: bool = False) -> None:
        runner = self.model_runner
        model = runner.model
        runner.model = _Collect(model, self._vllm_rl_pending())
        try:
            receive(*args, empty_cache=empty_cache)
        finally:
            runner.model = model
        if empty_cache:                 # OpenRLHF's mark of the last parameter of a sync
            self.vllm_rl_flush_weights()

    def update_weight(self, name, dtype, shape, empty_cache=False):
        self._collecting(super().update_weight, name, dtype, shape, empty_cache=empty_cache)

    def update_weight_cuda_ipc(self, name, dtype, shape, ipc_handles=None, empty_cache=False):
        self._collecting(super().update_weight_cuda_ipc, name, dtype, shape, ipc_handles,
                         empty_cache=empty_cache)

    def vllm_rl_flush_weights(self) -> int:
        """Load the received parameters at once (vLLM's ``reload_weights``); their count."""
        pending = self._vllm_rl_pending()
        if not pending:
            return 0
        weights, self._vllm_rl_weights = list(pending), []
        self.reload_weights(weights_iterator=weights)
        return len(weights)
