"""Ending samples now, in the RL scheduler: through vLLM's ``finish_requests`` (KV blocks
freed at once), each with a final output of its own, and the step's stats taken again
after the ends (:class:`FinishMixin`).  The records are written before, by the rule that
ended each sample (:mod:`vllm_rl.engine.records`).
"""
from __future__ import annotations

from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs
from vllm.v1.request import RequestStatus

# How an early end shows in vLLM's own finish_reason ("abort"): the sample did not end
# by itself.  The exact reason is in the RolloutInfo record.
EARLY_END_STATUS = RequestStatus.FINISHED_ABORTED


class FinishMixin:
    """Early ends on vLLM's scheduler (module docstring)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._ended_early = False           # this update ended a sample early (_restat)

    def _finish_now(self, request_ids: list[str], outputs: dict[int, EngineCoreOutputs]) -> None:
        """End these requests now (records already written): free their blocks through
        vLLM's ``finish_requests`` and emit their final output; once the step's rules are
        done, its stats, which vLLM built before these ends, are taken again
        (:meth:`_restat`, once a step)."""
        for request in self.finish_requests(request_ids, EARLY_END_STATUS):
            eco = outputs.get(request.client_index)
            if eco is None:
                eco = outputs[request.client_index] = EngineCoreOutputs()
            eco.outputs.append(EngineCoreOutput(
                request_id=request.request_id,
                new_token_ids=[],
                finish_reason=request.get_finished_reason(),
                stop_reason=request.stop_reason,
                events=request.take_events(),
                trace_headers=request.trace_headers,
            ))
        self._ended_early = True

    def _restat(self, outputs: dict[int, EngineCoreOutputs]) -> None:
        """vLLM builds a step's ``SchedulerStats`` at the end of its update, before the
        rules end samples early; the early ends free blocks and requests after it.
        The KV-cache usage and the request counts are taken again here (vLLM's own
        ``get_kv_cache_usage`` and ``get_request_counts``), so ``vllm:kv_cache_usage_perc``
        and ``vllm:num_requests_running`` / ``waiting`` say what the ends left, even when
        no further step runs.  Once, in a step that ended a sample early."""
        for eco in outputs.values():
            stats = eco.scheduler_stats
            if stats is not None:
                running, waiting = self.get_request_counts()
                stats.kv_cache_usage = self.get_kv_cache_usage()
                stats.num_running_reqs = running
                stats.num_waiting_reqs = max(0, waiting - stats.num_skipped_waiting_reqs)


__all__ = ["EARLY_END_STATUS", "FinishMixin"]
