"""The engine's step trace: what every engine step computed, to price it on other hardware.

One step is, per sequence it ran, the query tokens it computed (``1`` for a decode,
``1 + k`` when verifying ``k`` drafts, a prompt chunk for a prefill) and the context
already cached before the step.  These are the scheduler's own decisions, independent of
the machine that ran them, so the same trace can be priced with any
:class:`~vllm_rl.cost.StepCost` (``trace.project(load_cost("h100:qwen3-8b"))``): a CPU run
of the embedded model becomes a *projection* of the same steps on a GPU.  The trace also
keeps each step's wall time on the machine that ran it.

Switch it on per engine with ``vllm_rl.LLM(trace=True)`` (``additional_config
["vllm_rl_trace"]``); :class:`TracedScheduler` is stock vLLM's ``AsyncScheduler`` with
only the trace, for baselines, and :class:`TracedSyncScheduler` its synchronous twin.
Read it with :func:`engine_trace` (in-process engines, ``VLLM_ENABLE_V1_MULTIPROCESSING=0``).
"""
from __future__ import annotations

import time
from array import array
from collections.abc import Iterator
from typing import Any

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

from vllm_rl.settings import TRACE_KEY as CONFIG_KEY


class StepTrace:
    """Per engine step: query widths and cached contexts of its sequences, wall ms."""

    def __init__(self, max_steps: int = 1_000_000) -> None:
        self.max_steps = max_steps
        self._offsets = array("q", [0])
        self._widths = array("l")
        self._contexts = array("l")
        self.wall_ms = array("d")
        self.dropped = 0

    def record(self, widths: list[int], contexts: list[int]) -> None:
        if len(self) >= self.max_steps:
            self.dropped += 1
            return
        self._widths.extend(widths)
        self._contexts.extend(contexts)
        self._offsets.append(len(self._widths))

    def add_wall(self, ms: float) -> None:
        """Wall time of one step's output on this machine (from the previous output, or
        from the first schedule after the engine was idle)."""
        if len(self.wall_ms) < self.max_steps:
            self.wall_ms.append(ms)

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def steps(self) -> Iterator[tuple[array, array]]:
        for i in range(len(self)):
            a, b = self._offsets[i], self._offsets[i + 1]
            yield self._widths[a:b], self._contexts[a:b]

    def clear(self) -> None:
        self.__init__(self.max_steps)

    def mark(self) -> tuple[int, int]:
        """A position to slice from later (:meth:`since`)."""
        return len(self), len(self.wall_ms)

    def since(self, mark: tuple[int, int]) -> "StepTrace":
        """The steps recorded after ``mark``, as a trace of their own."""
        out = StepTrace(self.max_steps)
        start = self._offsets[mark[0]]
        out._offsets = array("q", (o - start for o in self._offsets[mark[0]:]))
        out._widths = self._widths[start:]
        out._contexts = self._contexts[start:]
        out.wall_ms = self.wall_ms[mark[1]:]
        return out

    def summary(self) -> dict[str, float]:
        n = len(self)
        seqs = len(self._widths)
        return {"steps": n, "sequences": seqs, "tokens": int(sum(self._widths)),
                "mean_batch": seqs / n if n else 0.0,
                "max_batch": max((self._offsets[i + 1] - self._offsets[i]
                                  for i in range(n)), default=0)}

    def project(self, cost: Any):
        """The same steps priced by ``cost`` (a :class:`vllm_rl.cost.StepCost`)."""
        from vllm_rl.cost import project

        return project(self.steps(), cost)

    def to_dict(self) -> dict[str, list]:
        return {"offsets": list(self._offsets), "widths": list(self._widths),
                "contexts": list(self._contexts), "wall_ms": list(self.wall_ms)}


class TraceMixin:
    """Records each step the scheduler sends (``schedule``) and its wall time."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        extra = getattr(self.vllm_config, "additional_config", None) or {}
        self.rl_trace: StepTrace | None = StepTrace() if extra.get(CONFIG_KEY) else None
        self._trace_t0: float | None = None

    def schedule(self, *args, **kwargs):
        out = super().schedule(*args, **kwargs)
        trace = self.rl_trace
        if trace is not None and out.num_scheduled_tokens:
            widths, contexts = [], []
            for rid, q in out.num_scheduled_tokens.items():
                widths.append(q)
                contexts.append(max(0, self.requests[rid].num_computed_tokens - q))
            trace.record(widths, contexts)
            if self._trace_t0 is None:
                self._trace_t0 = time.perf_counter()
        return out

    def update_from_output(self, scheduler_output, model_runner_output):
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        if self.rl_trace is not None and self._trace_t0 is not None \
                and scheduler_output.total_num_scheduled_tokens:
            now = time.perf_counter()
            self.rl_trace.add_wall((now - self._trace_t0) * 1e3)
            self._trace_t0 = now if self.has_unfinished_requests() else None
        return outputs


class TracedScheduler(TraceMixin, AsyncScheduler):
    """Stock vLLM's ``AsyncScheduler`` with the step trace (baselines)."""


class TracedSyncScheduler(TraceMixin, Scheduler):
    """Stock vLLM's synchronous ``Scheduler`` with the step trace (baselines)."""


TRACED_SCHEDULER_CLS = f"{__name__}.TracedScheduler"
TRACED_SYNC_SCHEDULER_CLS = f"{__name__}.TracedSyncScheduler"


def engine_scheduler(llm: Any):
    """The scheduler object of an in-process engine (``vllm.LLM`` or ``LLMEngine``)."""
    engine = getattr(llm, "llm_engine", llm)
    core = getattr(engine.engine_core, "engine_core", None)
    if core is None:
        raise RuntimeError("the engine's scheduler lives in another process; start the "
                           "engine in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0) to read it")
    return core.scheduler


def engine_trace(llm: Any) -> StepTrace:
    """The step trace of an in-process engine started with tracing on."""
    trace = getattr(engine_scheduler(llm), "rl_trace", None)
    if trace is None:
        raise RuntimeError("the engine has no step trace: start it with vllm_rl.LLM(trace=True) "
                           f"or additional_config={{'{CONFIG_KEY}': True}} and a vllm_rl scheduler")
    return trace
