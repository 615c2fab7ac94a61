"""ARRoL's head API on the worker (``worker_extension_cls``): ``arrol_update``, ``arrol_info``.

The head and its calibration live with the model runner (:class:`HeadScorer`); the
client reaches them with ``collective_rpc``, which vLLM runs between steps, so an
update takes effect on the next step and never inside one (``vllm_rl.LLM.arrol_update``,
``AsyncLLM.collective_rpc("arrol_update", ...)``, the server's ``POST /vllm_rl/arrol``).
"""
from __future__ import annotations

from typing import Any


class ArrolWorkerExtension:
    def _arrol(self):
        from vllm_rl.arrol.scorer import scorer_of

        runner = getattr(self, "model_runner", None)
        if runner is not None and not hasattr(runner, "execute_model_state"):
            raise RuntimeError(f"ARRoL needs vLLM's V1 model runner; this worker runs "
                               f"{type(runner).__name__}")
        scorer = scorer_of(runner) if runner is not None else None
        if scorer is None:
            raise RuntimeError("this engine was started without an ARRoL quality head "
                               "(use vllm_rl.LLM(arrol=...))")
        return scorer

    def arrol_update(self, head: Any = None, calibration: Any = None,
                     cold_start: bool = False, version: int | None = None) -> int:
        """Load head weights (``QualityHead.export``) and/or a calibration
        (``Calibration.to_dict``); ``cold_start=True`` drops the calibration.  Returns
        the new head version, named by every record scored from now on."""
        return self._arrol().update(head, calibration, cold_start, version)

    def arrol_info(self) -> dict[str, Any]:
        """The head's version, shape, calibration, and the samples scored and pruned."""
        return self._arrol().info()
