"""Host time: the CPU work around each forward pass, measured, and its place in a step.

Two parts, for the step trace (:mod:`vllm_rl.engine.trace`) and :func:`host_counted`:

* :data:`WORKER` counts the host time of vllm_rl's own work in the model runner, summed
  since it was last read: DAS's drafter (``DASProposer.propose``) and ARRoL's scorer
  (``HeadScorer.plan`` / ``finish``), one ``perf_counter_ns`` pair per call.  The counter
  is per process, so the engine core reads it only where the worker runs in the same
  process (in-process engines, ``VLLM_ENABLE_V1_MULTIPROCESSING=0``: what the benches
  use); with a worker process of its own it stays in that process and the trace reads 0.
* :func:`host_counted` prices a step as the forward pass (a projection from a step-cost
  table) plus the host time on its critical path, by how the engine schedules.

Pure Python, stdlib only: the drafter and the scorer import it in the worker.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["WORKER", "WorkerHostTime", "host_counted"]


class WorkerHostTime:
    """Nanoseconds of host time spent in the drafter and the scorer since the last
    :meth:`take` (the step trace takes them once per engine step)."""

    __slots__ = ("drafter_ns", "scorer_ns")

    def __init__(self) -> None:
        self.drafter_ns = 0
        self.scorer_ns = 0

    def take(self) -> tuple[int, int]:
        """``(drafter_ns, scorer_ns)`` since the last take, and zero them."""
        out = self.drafter_ns, self.scorer_ns
        self.drafter_ns = self.scorer_ns = 0
        return out

    def reset(self) -> None:
        self.drafter_ns = self.scorer_ns = 0


#: The process's counter (the drafter and the scorer add to it; the trace takes it).
WORKER = WorkerHostTime()


def host_counted(gpu_ms: Sequence[float], core_ms: Sequence[float],
                 worker_ms: Sequence[float], asynchronous: bool,
                 host_scale: float = 1.0) -> list[float]:
    """Each step's time with its host time counted, in ms.

    Per step: ``gpu`` is the forward pass (projected), ``core`` the engine core's host
    time (``schedule`` and ``update_from_output``, the RL scheduler's hooks included),
    ``worker`` the host time of the drafter and the scorer in the model runner; both host
    parts are multiplied by ``host_scale`` (a host CPU ``1 / host_scale`` times as fast as
    the one that measured them).

    * Synchronous scheduling (vLLM's ``Scheduler``: every DAS engine; vLLM refuses async
      scheduling with a ``custom_class`` drafter): the host work runs between forward
      passes, ``gpu + s·(core + worker)``.
    * Asynchronous scheduling (vLLM's ``AsyncScheduler``, its default on a GPU, stock
      vLLM here): the core schedules the next step and processes the previous one's
      output while the GPU computes, ``max(gpu, s·core) + s·worker``.  The worker part
      never overlaps: the drafter and the scorer run in the model runner between the
      forward pass whose output they read and the next one.
    """
    s = float(host_scale)
    if not (s >= 0.0 and math.isfinite(s)):
        raise ValueError(f"host_scale must be a finite number >= 0, got {host_scale!r}")
    if not len(gpu_ms) == len(core_ms) == len(worker_ms):
        raise ValueError("gpu_ms, core_ms and worker_ms must have one entry per step "
                         f"(got {len(gpu_ms)}, {len(core_ms)}, {len(worker_ms)})")
    if asynchronous:
        return [max(g, s * c) + s * w for g, c, w in zip(gpu_ms, core_ms, worker_ms)]
    return [g + s * (c + w) for g, c, w in zip(gpu_ms, core_ms, worker_ms)]
