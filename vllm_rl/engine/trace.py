"""The engine's step trace: what every engine step computed, to price it on other hardware.

One step is, per sequence it ran, the query tokens it computed (``1`` for a decode,
``1 + k`` when verifying ``k`` drafts, a prompt chunk for a prefill) and the context
already cached before the step.  These are the scheduler's own decisions, independent of
the machine that ran them, so the same trace can be priced with any
:class:`~vllm_rl.cost.StepCost` (``trace.project(load_cost("h100:qwen3-8b"))``): a CPU run
of the embedded model becomes a *projection* of the same steps on a GPU.  The trace also
keeps each step's wall time on the machine that ran it and its host time: the CPU work
on the step's critical path apart from the forward pass (scheduling, output processing
with the RL hooks, DAS's drafter, ARRoL's scorer), which a GPU server's host does the
same; ``trace.project(cost, host_scale=1.0)`` prices the steps both without it
(``gpu_ms``) and with it (``host_counted_ms``, :func:`vllm_rl.cost.host.host_counted`:
added to the forward pass in a synchronous engine, overlapped with it in an asynchronous
one).  Of the engine core's host time it also keeps the part Python's garbage collector
took (``gc_ns``, :class:`GcClock`), so a long host step can be told from a collection.

Switch it on per engine with ``vllm_rl.LLM(trace=True)`` (``additional_config
["vllm_rl_trace"]``); :class:`TracedScheduler` is stock vLLM's ``AsyncScheduler`` with
only the trace, for baselines, and :class:`TracedSyncScheduler` its synchronous twin.
Read it with :func:`engine_trace` (in-process engines, ``VLLM_ENABLE_V1_MULTIPROCESSING=0``).
"""
from __future__ import annotations

import gc
import math
import time
from array import array
from collections.abc import Iterator
from time import perf_counter_ns
from typing import Any

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

from vllm_rl import step_output
from vllm_rl.cost.host import WORKER
from vllm_rl.engine import TRACE_KEY as CONFIG_KEY


class GcClock:
    """The time Python's garbage collector has run in this process, in ns: one callback
    in ``gc.callbacks`` (installed by the first traced scheduler, never by an untraced
    engine) adds each collection's duration to :attr:`total_ns`."""

    def __init__(self) -> None:
        self.total_ns = 0
        self._start = 0

    def install(self) -> None:
        if self._on_gc not in gc.callbacks:
            gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = perf_counter_ns()
        else:
            self.total_ns += perf_counter_ns() - self._start


GC = GcClock()


class StepTrace:
    """Per engine step: query widths and cached contexts of its sequences, wall ms, and
    the host time on its critical path (ns): ``schedule_ns`` (the scheduler's
    ``schedule``), ``update_ns`` (``update_from_output``, the RL scheduler's hooks
    included), ``drafter_ns`` and ``scorer_ns`` (DAS's drafter and ARRoL's scorer in the
    model runner, in-process engines only: :data:`vllm_rl.cost.host.WORKER`) and
    ``path_ns`` (host time after a wait for the device, async DAS steps that draft);
    ``gc_ns``, the part of the core's (schedule and update) the garbage collector took.
    ``asynchronous`` is how the engine schedules (its scheduler is vLLM's
    ``AsyncScheduler``); ``None`` for a trace built by hand."""

    def __init__(self, max_steps: int = 1_000_000, asynchronous: bool | None = None) -> None:
        self.max_steps = max_steps
        self.asynchronous = asynchronous
        self._offsets = array("q", [0])
        self._widths = array("l")
        self._contexts = array("l")
        self.wall_ms = array("d")
        # per step, in step order (appended by ``record``)
        self.schedule_ns = array("q")
        # per step output, in step order (appended by ``add_host``, one per update)
        self.update_ns = array("q")
        self.drafter_ns = array("q")
        self.scorer_ns = array("q")
        self.path_ns = array("q")
        self.gc_ns = array("q")
        self.dropped = 0

    def record(self, widths: list[int], contexts: list[int], schedule_ns: int = 0) -> int:
        """One step's sequences; returns the position of its first width (-1: dropped)."""
        if len(self) >= self.max_steps:
            self.dropped += 1
            return -1
        start = len(self._widths)
        self._widths.extend(widths)
        self._contexts.extend(contexts)
        self._offsets.append(len(self._widths))
        self.schedule_ns.append(schedule_ns)
        return start

    def narrow(self, position: int, by: int) -> None:
        """A sequence computed ``by`` fewer query tokens than it was scheduled (async
        speculative decoding: placeholder drafts the worker cut, ``patches/model_runner/das_async.py``)."""
        self._widths[position] -= by

    def add_wall(self, ms: float) -> None:
        """Wall time of one step's output on this machine (from the previous output, or
        from the first schedule after the engine was idle)."""
        if len(self.wall_ms) < self.max_steps:
            self.wall_ms.append(ms)

    def add_host(self, update_ns: int, drafter_ns: int = 0, scorer_ns: int = 0,
                 path_ns: int = 0, gc_ns: int = 0) -> None:
        """Host time of one step's output: ``update_from_output``, and the drafter's,
        the scorer's and the path time since the previous output; ``gc_ns`` of the
        core's time since the previous output was garbage collection."""
        if len(self.update_ns) < self.max_steps:
            self.update_ns.append(update_ns)
            self.drafter_ns.append(drafter_ns)
            self.scorer_ns.append(scorer_ns)
            self.path_ns.append(path_ns)
            self.gc_ns.append(gc_ns)

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def steps(self) -> Iterator[tuple[array, array]]:
        for i in range(len(self)):
            a, b = self._offsets[i], self._offsets[i + 1]
            yield self._widths[a:b], self._contexts[a:b]

    def clear(self) -> None:
        self.__init__(self.max_steps, self.asynchronous)

    def mark(self) -> tuple[int, int, int]:
        """A position to slice from later (:meth:`since`)."""
        return len(self), len(self.wall_ms), len(self.update_ns)

    def since(self, mark: tuple[int, ...]) -> "StepTrace":
        """The steps recorded after ``mark``, as a trace of their own."""
        out = StepTrace(self.max_steps, self.asynchronous)
        steps, walls = mark[0], mark[1]
        hosts = mark[2] if len(mark) > 2 else walls
        start = self._offsets[steps]
        out._offsets = array("q", (o - start for o in self._offsets[steps:]))
        out._widths = self._widths[start:]
        out._contexts = self._contexts[start:]
        out.wall_ms = self.wall_ms[walls:]
        out.schedule_ns = self.schedule_ns[steps:]
        out.update_ns = self.update_ns[hosts:]
        out.drafter_ns = self.drafter_ns[hosts:]
        out.scorer_ns = self.scorer_ns[hosts:]
        out.path_ns = self.path_ns[hosts:]
        out.gc_ns = self.gc_ns[hosts:]
        return out

    def host_ms(self) -> tuple[list[float], list[float], list[float]]:
        """Per step, ``(core, worker, path)`` host ms as measured: core = schedule +
        update, worker = drafter + scorer, path = after a wait for the device.  A step
        whose output has not come back yet (the last one or two of an engine still
        running) counts its schedule only."""
        n = len(self)
        core = [ns / 1e6 for ns in self.schedule_ns[:n]]
        core += [0.0] * (n - len(core))
        worker, path = [0.0] * n, [0.0] * n
        for i, (u, d, sc, p) in enumerate(zip(self.update_ns[:n], self.drafter_ns[:n],
                                              self.scorer_ns[:n], self.path_ns[:n])):
            core[i] += u / 1e6
            worker[i] = (d + sc) / 1e6
            path[i] = p / 1e6
        return core, worker, path

    def gc_ms(self) -> list[float]:
        """Per step, the ms of its core host time (:meth:`host_ms`) that were garbage
        collection."""
        n = len(self)
        out = [ns / 1e6 for ns in self.gc_ns[:n]]
        return out + [0.0] * (n - len(out))

    def summary(self) -> dict[str, float]:
        n = len(self)
        seqs = len(self._widths)
        ms = 1e-6
        return {"steps": n, "sequences": seqs, "tokens": int(sum(self._widths)),
                "mean_batch": seqs / n if n else 0.0,
                "max_batch": max((self._offsets[i + 1] - self._offsets[i]
                                  for i in range(n)), default=0),
                "schedule_ms": sum(self.schedule_ns) * ms, "update_ms": sum(self.update_ns) * ms,
                "drafter_ms": sum(self.drafter_ns) * ms, "scorer_ms": sum(self.scorer_ns) * ms,
                "path_ms": sum(self.path_ns) * ms, "gc_ms": sum(self.gc_ns) * ms}

    def project(self, cost: Any, host_scale: float = 1.0):
        """The same steps priced by ``cost`` (a :class:`vllm_rl.cost.StepCost` or a
        :func:`~vllm_rl.cost.load_cost` spec): a :class:`~vllm_rl.cost.Projection` whose
        ``total_ms`` (``gpu_ms``) is the forward passes only, and ``host_counted_ms`` the
        same steps with this trace's host times (times ``host_scale``) counted as the
        engine schedules (:func:`vllm_rl.cost.host.host_counted`; a trace of unknown
        scheduling counts them as a synchronous engine does)."""
        from dataclasses import replace

        from vllm_rl.cost import host_counted, project

        gpu = project(self.steps(), cost)
        core, worker, path = self.host_ms()
        asynchronous = bool(self.asynchronous)
        per_step = host_counted(gpu.per_step_ms, core, worker, asynchronous, host_scale,
                                path)
        s = float(host_scale)
        return replace(gpu, host_counted_ms=math.fsum(per_step),
                       per_step_host_counted_ms=per_step,
                       host_core_ms=s * math.fsum(core),
                       host_worker_ms=s * math.fsum(worker) + s * math.fsum(path),
                       host_path_ms=s * math.fsum(path),
                       host_scale=s, asynchronous=self.asynchronous)

    def to_dict(self) -> dict[str, Any]:
        return {"offsets": list(self._offsets), "widths": list(self._widths),
                "contexts": list(self._contexts), "wall_ms": list(self.wall_ms),
                "asynchronous": self.asynchronous, "schedule_ns": list(self.schedule_ns),
                "update_ns": list(self.update_ns), "drafter_ns": list(self.drafter_ns),
                "scorer_ns": list(self.scorer_ns), "path_ns": list(self.path_ns),
                "gc_ns": list(self.gc_ns)}


class TraceMixin:
    """Records each step the scheduler sends (``schedule``), its wall time and its host
    time.  The timing wraps the scheduler's whole override chain: with the trace on,
    ``schedule``, ``update_from_output`` and ``update_draft_token_ids`` are shadowed by
    instance attributes that time the class's own method (the RL scheduler's hooks
    included, whichever class sits above this one), one ``perf_counter_ns`` pair per
    call, and the garbage collector's time inside those calls (:data:`GC`); with the
    trace off nothing is wrapped."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        extra = getattr(self.vllm_config, "additional_config", None) or {}
        self.rl_trace: StepTrace | None = None
        self._trace_t0: float | None = None
        self._trace_pending_ns = 0     # host time of calls that scheduled nothing
        self._trace_gc_ns = 0          # of the core's time since the last output, GC's
        # async speculative steps in flight: scheduler output id -> (width position,
        # request id, placeholder drafts) of each sequence scheduled with placeholders
        self._trace_spec: dict[int, list[tuple[int, str, int]]] = {}
        if extra.get(CONFIG_KEY):
            self.rl_trace = StepTrace(asynchronous=isinstance(self, AsyncScheduler))
            GC.install()
            self.schedule = self._traced_schedule
            self.update_from_output = self._traced_update_from_output
            if hasattr(self, "update_draft_token_ids"):
                self.update_draft_token_ids = self._traced_update_draft_token_ids

    def _traced_schedule(self, *args, **kwargs):
        g0, t0 = GC.total_ns, perf_counter_ns()
        out = type(self).schedule(self, *args, **kwargs)
        dt = perf_counter_ns() - t0
        self._trace_gc_ns += GC.total_ns - g0
        if not out.num_scheduled_tokens:
            self._trace_pending_ns += dt
            return out
        widths, contexts = [], []
        requests = self.requests
        for rid, q in out.num_scheduled_tokens.items():
            widths.append(q)
            contexts.append(max(0, requests[rid].num_computed_tokens - q))
        start = self.rl_trace.record(widths, contexts, dt + self._trace_pending_ns)
        spec = getattr(out, "scheduled_spec_decode_tokens", None)
        if spec and start >= 0:            # placeholders: the worker may verify fewer
            pos = {rid: start + i for i, rid in enumerate(out.num_scheduled_tokens)}
            held = [(pos[rid], rid, len(toks)) for rid, toks in spec.items()
                    if toks and toks[0] < 0]
            if held:
                self._trace_spec[id(out)] = held
        self._trace_pending_ns = 0
        if self._trace_t0 is None:
            self._trace_t0 = time.perf_counter()
            WORKER.reset()          # what another engine's worker left in this process
        return out

    def _traced_update_from_output(self, scheduler_output, model_runner_output):
        g0, t0 = GC.total_ns, perf_counter_ns()
        outputs = type(self).update_from_output(self, scheduler_output, model_runner_output)
        t1 = perf_counter_ns()
        self._trace_gc_ns += GC.total_ns - g0
        held = self._trace_spec.pop(id(scheduler_output), None)
        step = step_output.of(model_runner_output)
        drafts = None if step is None else step.drafts
        if held and drafts is not None:     # the widths the worker ran (its real drafts)
            for position, rid, scheduled in held:
                self.rl_trace.narrow(position, scheduled - drafts.get(rid, 0))
        if self._trace_t0 is not None and scheduler_output.total_num_scheduled_tokens:
            self.rl_trace.add_host(t1 - t0, *WORKER.take(), gc_ns=self._trace_gc_ns)
            self._trace_gc_ns = 0
            now = time.perf_counter()
            self.rl_trace.add_wall((now - self._trace_t0) * 1e3)
            self._trace_t0 = now if self.has_unfinished_requests() else None
        else:
            self._trace_pending_ns += t1 - t0
        return outputs

    def _traced_update_draft_token_ids(self, *args, **kwargs):
        """The drafts of a synchronous engine, handed over after the output: host time
        of the next step's scheduling."""
        g0, t0 = GC.total_ns, perf_counter_ns()
        out = type(self).update_draft_token_ids(self, *args, **kwargs)
        self._trace_pending_ns += perf_counter_ns() - t0
        self._trace_gc_ns += GC.total_ns - g0
        return out


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
