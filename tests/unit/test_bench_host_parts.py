"""``vllm-rl bench host-parts``'s timers, phases, table and picture
(:mod:`vllm_rl.bench.host_parts`; the engines' run: ``tests/engine/test_bench_step.py``)."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from vllm_rl.bench import host_parts


class Toy:
    """Stands in for a scheduler: ``schedule`` marks a step, the others are parts."""

    def schedule(self, width: int, drafting: bool):
        return SimpleNamespace(num_scheduled_tokens=dict.fromkeys(range(width), 1),
                               scheduled_spec_decode_tokens={0: [-1]} if drafting else {})

    def work(self, n: int) -> int:
        return sum(range(n))


def test_timed_charges_each_call_to_its_step_and_puts_the_methods_back():
    parts = (("schedule", __name__, "Toy", "schedule"), ("work", __name__, "Toy", "work"))
    timers, toy, original = host_parts.Timers(), Toy(), Toy.__dict__["work"]
    with host_parts.timed(timers, parts):
        assert Toy.work is not original and Toy.work.__wrapped__ is original
        assert toy.work(10) == 45                      # before any step: charged to step 0
        toy.schedule(0, False)                         # nothing scheduled: no step
        toy.schedule(4, True)
        toy.work(1000)
        toy.schedule(2, False)
        toy.work(10)
        toy.work(10)
    assert Toy.__dict__["work"] is original
    assert timers.widths == [4, 2] and timers.drafting == [True, False]
    work = timers.per_step("work")
    assert work.shape == (2,) and (work > 0).all()
    assert set(timers.ns["work"]) == {0, 1} and len(timers.ns["schedule"]) == 2


def test_phases_table_and_picture(tmp_path):
    timers = host_parts.Timers(widths=[1000, 1000, 500, 50], drafting=[False, True, True, False])
    for label in ("schedule", "vLLM's update_from_output", "DAS before_step"):
        for step in range(4):
            timers.ns[label][step] = 1_000_000 * (step + 1)
    timers.ns["RL update_from_output"][2] = 9_000_000      # RL's update holds vLLM's
    gpu = np.array([40.0, 42.0, 20.0, 5.0])
    phases = host_parts.summarize(timers, gpu, full=1024)
    assert [p["steps"] for p in phases] == [1, 1, 1, 1]
    assert phases[0]["gpu_ms"] == 40.0 and phases[0]["parts"]["schedule"] == 1.0
    assert phases[2]["parts"]["update_from_output"] == 9.0       # the RL engine's whole update
    assert phases[3]["parts"]["update_from_output"] == 4.0       # vLLM's where no RL one ran
    text = host_parts.table({"stock": phases, "das": phases})
    assert "**full batch, no drafts** (steps: stock 1, das 1" in text
    assert "| · vLLM's update_from_output | 1.00 | 1.00 |" in text
    assert "| host, top-level parts | 3.00 | 3.00 |" in text       # schedule + update + DAS
    png = host_parts.picture({"stock": phases, "das": phases}, tmp_path / "p.png", "t")
    assert png.stat().st_size > 0
