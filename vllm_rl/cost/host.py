"""Host time: the CPU work around each forward pass, measured, and its place in a step.

Two parts, for the step trace (:mod:`vllm_rl.engine.trace`) and :func:`host_counted`:

* :data:`WORKER` counts the host time of vllm_rl's own work in the model runner, summed
  since it was last read: DAS's drafter (``DASProposer.propose`` / ``before_step`` /
  ``after_sample``) and ARRoL's scorer (``HeadScorer.plan`` / ``finish``), one
  ``perf_counter_ns`` pair per call, and apart from them the *path* time: under async
  scheduling, the host work of a step after it waited for the device (the drafter,
  having waited for the last step's sampled ids, feeds and drafts; then vLLM prepares
  the step's inputs until its forward pass starts, ``patches/model_runner/das_async.py``), during
  which the device has nothing queued.  The counter is per process, so the engine core
  reads it only where the worker runs in the same process (in-process engines,
  ``VLLM_ENABLE_V1_MULTIPROCESSING=0``: what the benches use); with a worker process of
  its own it stays in that process and the trace reads 0.
* :func:`host_counted` prices a step as the forward pass (a projection from a step-cost
  table) plus the host time on its critical path, by how the engine schedules.

Pure Python, stdlib only: the drafter and the scorer import it in the worker.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["WORKER", "WorkerHostTime", "host_counted"]


class WorkerHostTime:
    """Nanoseconds of host time spent in the drafter and the scorer, and on the path
    after a wait for the device (module docstring), since the last :meth:`take` (the
    step trace takes them once per engine step).  ``drafter_ns`` does not include the
    drafter's path time."""

    __slots__ = ("drafter_ns", "scorer_ns", "path_ns")

    def __init__(self) -> None:
        self.drafter_ns = 0
        self.scorer_ns = 0
        self.path_ns = 0

    def take(self) -> tuple[int, int, int]:
        """``(drafter_ns, scorer_ns, path_ns)`` since the last take, and zero them."""
        out = self.drafter_ns, self.scorer_ns, self.path_ns
        self.drafter_ns = self.scorer_ns = self.path_ns = 0
        return out

    def reset(self) -> None:
        self.drafter_ns = self.scorer_ns = self.path_ns = 0


#: The process's counter (the drafter and the scorer add to it; the trace takes it).
WORKER = WorkerHostTime()


def host_counted(gpu_ms: Sequence[float], core_ms: Sequence[float],
                 worker_ms: Sequence[float], asynchronous: bool,
                 host_scale: float = 1.0,
                 path_ms: Sequence[float] | None = None) -> list[float]:
    """Each step's time with its host time counted, in ms.

    Per step: ``gpu`` is the forward pass (projected), ``core`` the engine core's host
    time (``schedule`` and ``update_from_output``, the RL scheduler's hooks included),
    ``worker`` the host time of the drafter and the scorer in the model runner, ``path``
    (default 0) the host time after a wait for the device (:data:`WORKER`); the host
    parts are multiplied by ``host_scale`` (a host CPU ``1 / host_scale`` times as fast
    as the one that measured them).

    * Synchronous scheduling (vLLM's ``Scheduler``): the host work runs between forward
      passes, ``gpu + s·(core + worker + path)``.
    * Asynchronous scheduling (vLLM's ``AsyncScheduler``, its default on a GPU): the host
      prepares step n + 1, and the core processes step n − 1's output, while the device
      computes step n; the drafter's and the scorer's work issues no device wait, so it
      runs ahead with vLLM's own, and the device waits only when the host falls behind:
      ``max(gpu, s·(core + worker)) + s·path`` (core and worker share one host thread
      and its interpreter, so their times add).  The path time is what a step waits for
      on the host after the device emptied: a DAS step that drafts waits for the last
      step's ids, then feeds, drafts and prepares its inputs.
    """
    s = float(host_scale)
    if not (s >= 0.0 and math.isfinite(s)):
        raise ValueError(f"host_scale must be a finite number >= 0, got {host_scale!r}")
    if path_ms is None:
        path_ms = [0.0] * len(gpu_ms)
    if not len(gpu_ms) == len(core_ms) == len(worker_ms) == len(path_ms):
        raise ValueError("gpu_ms, core_ms, worker_ms and path_ms must have one entry per "
                         f"step (got {len(gpu_ms)}, {len(core_ms)}, {len(worker_ms)}, "
                         f"{len(path_ms)})")
    if asynchronous:
        return [max(g, s * (c + w)) + s * p
                for g, c, w, p in zip(gpu_ms, core_ms, worker_ms, path_ms)]
    return [g + s * (c + w + p) for g, c, w, p in zip(gpu_ms, core_ms, worker_ms, path_ms)]
