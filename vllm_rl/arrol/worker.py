"""ARRoL's head API on the worker (``worker_extension_cls``): ``arrol_update``,
``arrol_info``, ``arrol_hidden``.

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
        """The head's version, shape, calibration, the samples scored and pruned, and the
        hidden states kept (``hidden_kept``) and dropped unclaimed (``hidden_dropped``)."""
        return self._arrol().info()

    def arrol_hidden(self, request_ids: list[str]) -> dict[str, bytes]:
        """Take the hidden states at ``l_detect`` this worker kept for these request ids
        (``arrol.return_hidden``; the records' ``hidden_id``): request id -> float32
        little-endian bytes (:func:`vllm_rl.arrol.hidden.hidden_to_wire`: vLLM's engine
        core returns a utility result through msgpack, which keeps bytes, not numpy
        arrays; clients read them back with ``hidden_from_wire``); an id with none kept
        is absent.  Taken once: a second call for the same id returns nothing for it."""
        from vllm_rl.arrol.hidden import hidden_to_wire

        return hidden_to_wire(self._arrol().take_hidden(request_ids))
