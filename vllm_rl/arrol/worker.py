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
        runner = getattr(self, "model_runner", None)
        scorer = getattr(runner, "vllm_rl_arrol", None) if runner is not None else None
        if scorer is not None:
            return scorer
        from vllm_rl.arrol.config import CONFIG_KEY
        from vllm_rl.arrol.scorer import HeadScorer

        extra = getattr(getattr(runner, "vllm_config", None), "additional_config", None) or {}
        if runner is None or CONFIG_KEY not in extra:
            raise RuntimeError("this engine was started without an ARRoL quality head "
                               "(use vllm_rl.LLM(arrol=...))")
        if not hasattr(runner, "execute_model_state"):
            raise RuntimeError(f"ARRoL needs vLLM's V1 model runner; this worker runs "
                               f"{type(runner).__name__}")
        runner.vllm_rl_arrol = HeadScorer.for_runner(runner)
        return runner.vllm_rl_arrol

    def arrol_update(self, head: Any = None, calibration: Any = None,
                     cold_start: bool = False, version: int | None = None) -> int:
        """Load head weights (``QualityHead.export``) and/or a calibration
        (``Calibration.to_dict``); ``cold_start=True`` drops the calibration.  Returns
        the new head version, named by every record scored from now on."""
        return self._arrol().update(head, calibration, cold_start, version)

    def arrol_info(self) -> dict[str, Any]:
        """The head's version, shape, calibration, and the samples scored and pruned."""
        return self._arrol().info()
