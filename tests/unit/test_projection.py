"""The host-counted projection: its arithmetic (synchronous engines sum the host time with
the forward pass, asynchronous ones overlap the core's part), ``host_scale``, and the step
trace's host-time fields, on hand-built traces and a scheduler stand-in with a fake clock
(no engine, nothing timed)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from vllm_rl.cost import Projection, StepCost, host_counted, project
from vllm_rl.cost.host import WORKER, WorkerHostTime
from vllm_rl.step_output import StepOutput


class PerSeq(StepCost):
    """1 ms per sequence in the step: easy to price by hand."""

    name = "per-seq"

    def uniform_ms(self, batch, width=1, context=256):
        return float(batch)


MS = 1_000_000      # ns


# ------------------------------------------------------------------------ arithmetic


def test_sync_sums_gpu_and_host():
    assert host_counted([10.0, 5.0], [2.0, 8.0], [1.0, 0.0], asynchronous=False) \
        == pytest.approx([13.0, 13.0])


def test_async_overlaps_the_host_and_adds_the_path():
    # max(10, 2 + 1) and max(5, 8 + 0): the core's and the worker's host time (no device
    # wait) hide under a long forward pass and show when they are the longer
    assert host_counted([10.0, 5.0], [2.0, 8.0], [1.0, 0.0], asynchronous=True) \
        == pytest.approx([10.0, 8.0])
    # the path (after a wait for the device) adds to the step, scheduled either way
    assert host_counted([10.0, 5.0], [2.0, 8.0], [1.0, 0.0], True, path_ms=[0.5, 2.0]) \
        == pytest.approx([10.5, 10.0])
    assert host_counted([10.0, 5.0], [2.0, 8.0], [1.0, 0.0], False, path_ms=[0.5, 2.0]) \
        == pytest.approx([13.5, 15.0])


def test_host_scale_multiplies_the_host_times_only():
    gpu, core, worker = [10.0, 5.0], [2.0, 8.0], [1.0, 0.0]
    assert host_counted(gpu, core, worker, False, host_scale=0.5) == pytest.approx([11.5, 9.0])
    assert host_counted(gpu, core, worker, True, host_scale=0.5) == pytest.approx([10.0, 5.0])
    assert host_counted(gpu, core, worker, True, host_scale=4.0) == pytest.approx([12.0, 32.0])
    assert host_counted(gpu, core, worker, True, 2.0, [1.0, 0.0]) == pytest.approx([12.0, 16.0])
    for asynchronous in (False, True):     # a free host: the GPU-only projection
        assert host_counted(gpu, core, worker, asynchronous, host_scale=0.0) == gpu


def test_host_counted_checks_its_input():
    with pytest.raises(ValueError, match="host_scale"):
        host_counted([1.0], [1.0], [1.0], False, host_scale=-1.0)
    with pytest.raises(ValueError, match="host_scale"):
        host_counted([1.0], [1.0], [1.0], False, host_scale=float("nan"))
    with pytest.raises(ValueError, match="one entry per step"):
        host_counted([1.0, 2.0], [1.0], [1.0], False)
    with pytest.raises(ValueError, match="one entry per step"):
        host_counted([1.0], [1.0], [1.0], False, path_ms=[1.0, 1.0])
    assert host_counted([], [], [], True) == []


# ------------------------------------------------------------------- hand-built traces


def _trace(asynchronous):
    from vllm_rl.engine.trace import StepTrace

    t = StepTrace(asynchronous=asynchronous)
    # step 0: 4 sequences (4 ms GPU), host 1 + 2 core, 0.5 drafter + 0.5 scorer
    t.record([1] * 4, [100] * 4, schedule_ns=1 * MS)
    t.add_host(2 * MS, MS // 2, MS // 2)
    # step 1: 2 sequences (2 ms GPU), host 3 + 4 core, nothing in the worker
    t.record([1, 3], [10, 20], schedule_ns=3 * MS)
    t.add_host(4 * MS)
    return t


def test_trace_projection_sync_engine():
    p = _trace(False).project(PerSeq())
    assert isinstance(p, Projection) and p.asynchronous is False and p.host_scale == 1.0
    assert p.gpu_ms == p.total_ms == pytest.approx(6.0)
    assert p.per_step_ms == pytest.approx([4.0, 2.0])
    assert p.per_step_host_counted_ms == pytest.approx([4 + 3 + 1, 2 + 7])
    assert p.host_counted_ms == pytest.approx(17.0)
    assert (p.host_core_ms, p.host_worker_ms) == pytest.approx((10.0, 1.0))


def test_trace_projection_async_engine_and_host_scale():
    t = _trace(True)
    p = t.project(PerSeq())
    assert p.asynchronous is True
    assert p.per_step_host_counted_ms == pytest.approx([max(4, 3 + 1), max(2, 7)])
    half = t.project(PerSeq(), host_scale=0.5)
    assert half.gpu_ms == pytest.approx(p.gpu_ms)                  # the GPU part is unscaled
    assert half.per_step_host_counted_ms == pytest.approx([4, 3.5])
    assert (half.host_core_ms, half.host_worker_ms) == pytest.approx((5.0, 0.5))
    assert t.project(PerSeq(), host_scale=0.0).host_counted_ms == pytest.approx(p.gpu_ms)


def test_stock_is_priced_async_and_a_sync_rl_engine_pays_its_host():
    """The same steps and host times: stock vLLM (async scheduling, as on a GPU) hides its
    core host time under the forward pass, a DAS engine (sync) pays it in full."""
    stock, das = _trace(True).project(PerSeq()), _trace(False).project(PerSeq())
    assert stock.gpu_ms == das.gpu_ms
    assert stock.host_counted_ms < das.host_counted_ms
    assert das.host_counted_ms == pytest.approx(das.gpu_ms + das.host_core_ms
                                                + das.host_worker_ms)


def test_a_trace_of_unknown_scheduling_counts_as_sync():
    from vllm_rl.engine.trace import StepTrace

    t = StepTrace()
    t.record([1], [0], schedule_ns=2 * MS)
    t.add_host(MS)
    p = t.project(PerSeq())
    assert p.asynchronous is None and p.host_counted_ms == pytest.approx(1 + 3)


def test_a_step_without_its_output_yet_counts_its_schedule_only():
    from vllm_rl.engine.trace import StepTrace

    t = StepTrace(asynchronous=False)
    t.record([1], [0], schedule_ns=MS)
    t.add_host(2 * MS, 3 * MS, 0)
    t.record([1, 1], [0, 0], schedule_ns=4 * MS)       # in flight: no add_host yet
    core, worker, path = t.host_ms()
    assert core == pytest.approx([3.0, 4.0]) and worker == pytest.approx([3.0, 0.0])
    assert path == [0.0, 0.0]
    assert t.project(PerSeq()).per_step_host_counted_ms == pytest.approx([1 + 6, 2 + 4])


def test_since_mark_slices_the_host_times():
    t = _trace(True)
    mark = t.mark()
    t.record([1], [5], schedule_ns=7 * MS)
    t.add_wall(9.0)
    t.add_host(8 * MS, 1 * MS, 2 * MS, 3 * MS, gc_ns=4 * MS)
    part = t.since(mark)
    assert len(part) == 1 and part.asynchronous is True
    assert list(part.schedule_ns) == [7 * MS] and list(part.update_ns) == [8 * MS]
    assert list(part.drafter_ns) == [MS] and list(part.scorer_ns) == [2 * MS]
    assert part.host_ms() == ([15.0], [3.0], [3.0]) and part.gc_ms() == [4.0]
    assert t.gc_ms() == [0.0, 0.0, 4.0]
    p = part.project(PerSeq())
    assert p.per_step_host_counted_ms == pytest.approx([max(1, 15 + 3) + 3])
    assert (p.host_worker_ms, p.host_path_ms) == pytest.approx((6.0, 3.0))
    assert t.since(t.mark()).project(PerSeq()).host_counted_ms == 0.0
    d = t.to_dict()
    assert d["asynchronous"] is True and len(d["schedule_ns"]) == 3 == len(d["update_ns"])
    assert d["gc_ns"] == [0, 0, 4 * MS]
    s = t.summary()
    assert s["schedule_ms"] == pytest.approx(11.0) and s["scorer_ms"] == pytest.approx(2.5)
    assert s["gc_ms"] == pytest.approx(4.0)


def test_the_gpu_only_projection_is_unchanged():
    steps = [([1] * 4, [100] * 4), ([1, 3], [10, 20])]
    p = project(steps, PerSeq())
    assert p.total_ms == p.gpu_ms == pytest.approx(6.0)
    assert p.host_counted_ms is None and p.asynchronous is None
    assert _trace(False).project(PerSeq()).total_ms == pytest.approx(p.total_ms)
    assert p.to_dict()["gpu_ms"] == pytest.approx(6.0)


def test_worker_counter_takes_and_zeroes():
    w = WorkerHostTime()
    w.drafter_ns += 5
    w.scorer_ns += 7
    w.path_ns += 3
    assert w.take() == (5, 7, 3) and w.take() == (0, 0, 0)


# --------------------------------------------------------- the scheduler's timing hooks


class _Clock:
    def __init__(self):
        self.ns = 0

    def __call__(self):
        return self.ns


def _scheduler_classes(clock):
    """A stand-in for vLLM's scheduler under the trace and an RL-style hook above it;
    each method advances the fake clock by a known amount."""
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    from vllm_rl.engine.trace import TraceMixin

    class Base:
        def __init__(self):
            self.vllm_config = SimpleNamespace(additional_config={"vllm_rl_trace": True})
            self.requests = {"a": SimpleNamespace(num_computed_tokens=10),
                             "b": SimpleNamespace(num_computed_tokens=3)}
            self.left = 2

        def schedule(self):
            clock.ns += 2 * MS
            return SimpleNamespace(num_scheduled_tokens={"a": 1, "b": 3},
                                   total_num_scheduled_tokens=4)

        def update_from_output(self, scheduler_output, model_runner_output):
            clock.ns += 1 * MS
            self.left -= 1
            return {}

        def has_unfinished_requests(self):
            return self.left > 0

        def update_draft_token_ids(self, drafts):
            clock.ns += 4 * MS

    class Hooks(TraceMixin):                  # like RLSchedulerMixin: work around super()
        def update_from_output(self, scheduler_output, model_runner_output):
            clock.ns += 5 * MS
            return super().update_from_output(scheduler_output, model_runner_output)

    class Sync(Hooks, Base):
        pass

    class Async(Hooks, Base, AsyncScheduler):
        pass

    return Sync, Async


def test_trace_mixin_times_the_whole_override_chain(monkeypatch):
    from vllm_rl.engine import trace as trace_mod

    clock = _Clock()
    monkeypatch.setattr(trace_mod, "perf_counter_ns", clock)
    Sync, Async = _scheduler_classes(clock)
    WORKER.reset()
    s = Sync()
    assert s.rl_trace.asynchronous is False and Async().rl_trace.asynchronous is True
    out = s.schedule()
    WORKER.drafter_ns += 3 * MS             # the worker's drafter, between the two calls
    s.update_from_output(out, None)
    s.update_draft_token_ids(None)          # next step's scheduling
    out = s.schedule()
    s.update_from_output(out, None)
    t = s.rl_trace
    w, c = next(t.steps())
    assert len(t) == 2 and list(w) == [1, 3] and list(c) == [9, 0]
    assert list(t.schedule_ns) == [2 * MS, (4 + 2) * MS]
    assert list(t.update_ns) == [6 * MS, 6 * MS]          # the RL hook's 5 ms included
    assert list(t.drafter_ns) == [3 * MS, 0] and list(t.scorer_ns) == [0, 0]
    assert len(t.wall_ms) == 2


def test_trace_counts_the_collectors_time_inside_the_core(monkeypatch):
    """The garbage collector's time inside the scheduler's traced calls goes to the step
    whose output comes next, as part of its core time (a fake collector clock)."""
    from vllm_rl.engine import trace as trace_mod

    clock = _Clock()
    collector = SimpleNamespace(total_ns=0, install=lambda: None)
    monkeypatch.setattr(trace_mod, "perf_counter_ns", clock)
    monkeypatch.setattr(trace_mod, "GC", collector)
    Sync, _ = _scheduler_classes(clock)

    class Collecting(Sync):
        def schedule(self):
            collector.total_ns += MS            # a collection inside the scheduler
            clock.ns += MS
            return super().schedule()

        def update_draft_token_ids(self, drafts):
            collector.total_ns += 2 * MS        # and one in the drafts' hand-over
            clock.ns += 2 * MS
            return super().update_draft_token_ids(drafts)

    s = Collecting()
    s.update_from_output(s.schedule(), None)
    s.update_draft_token_ids(None)
    collector.total_ns += 5 * MS                # outside the traced calls: not the core's
    s.update_from_output(s.schedule(), None)
    t = s.rl_trace
    assert list(t.gc_ns) == [MS, 3 * MS] and t.gc_ms() == [1.0, 3.0]
    core, _, _ = t.host_ms()
    assert core == [1 + 2 + 6, 2 + 4 + 1 + 2 + 6]         # the collections inside it


def test_the_collector_clock_counts_a_collection():
    import gc

    from vllm_rl.engine.trace import GcClock

    c = GcClock()
    c.install()
    c.install()                                   # once
    try:
        assert gc.callbacks.count(c._on_gc) == 1
        gc.collect()
        assert c.total_ns > 0
    finally:
        gc.callbacks.remove(c._on_gc)


def test_no_trace_no_wrapping():
    from vllm_rl.engine.trace import TraceMixin

    class Base:
        def __init__(self):
            self.vllm_config = SimpleNamespace(additional_config={})

        def schedule(self):
            return "out"

    class Plain(TraceMixin, Base):
        pass

    p = Plain()
    assert p.rl_trace is None and "schedule" not in vars(p) and p.schedule() == "out"


def test_trace_records_the_widths_the_worker_ran_under_async_drafts():
    """Async speculative decoding: the scheduler sends placeholder drafts, the worker
    verifies only the real ones and says how many (``StepOutput.drafts``); the trace keeps
    the widths the forward pass computed."""
    from vllm_rl.engine.trace import TraceMixin

    sched_out = SimpleNamespace(num_scheduled_tokens={"a": 9, "b": 9, "c": 1},
                                scheduled_spec_decode_tokens={"a": [-1] * 8, "b": [-1] * 8},
                                total_num_scheduled_tokens=19)

    class Base:
        def __init__(self):
            self.vllm_config = SimpleNamespace(additional_config={"vllm_rl_trace": True})
            self.requests = {r: SimpleNamespace(num_computed_tokens=20)
                             for r in ("a", "b", "c")}

        def schedule(self):
            return sched_out

        def update_from_output(self, so, mro):
            return {}

        def has_unfinished_requests(self):
            return True

    class Traced(TraceMixin, Base):
        pass

    s = Traced()
    out = s.schedule()
    s.update_from_output(out, SimpleNamespace(vllm_rl=StepOutput(drafts={"a": 3, "b": 0})))
    widths, _ = next(s.rl_trace.steps())
    assert list(widths) == [4, 1, 1]
    out = s.schedule()                     # an output without counts: widths as scheduled
    s.update_from_output(out, SimpleNamespace())
    assert list(list(s.rl_trace.steps())[1][0]) == [9, 9, 1]
