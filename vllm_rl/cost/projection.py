"""The projected time of a trace of engine steps under one step-cost model:
:class:`Projection` and :func:`project` (any :func:`~vllm_rl.cost.load.load_cost` spec).

Pure Python, stdlib only.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vllm_rl.cost.base import StepCost
from vllm_rl.cost.load import load_cost

__all__ = ["Projection", "project"]


@dataclass(frozen=True)
class Projection:
    """The projected time of a trace of steps under one cost model.

    ``total_ms`` (= :attr:`gpu_ms`) prices the forward passes only.  A projection of a
    :class:`~vllm_rl.engine.trace.StepTrace` that recorded host times also counts them
    (:func:`vllm_rl.cost.host.host_counted`): ``host_counted_ms`` is the same steps with
    the host time on their critical path, ``host_core_ms`` / ``host_worker_ms`` the host
    times it counted (engine core: schedule and output processing; worker: drafter and
    scorer, their path time included), ``host_path_ms`` the part of it after a wait for
    the device (:data:`vllm_rl.cost.host.WORKER`), already multiplied by ``host_scale``;
    ``asynchronous`` says how the engine scheduled.  Without host times these stay ``None``.
    """

    total_ms: float
    steps: int
    per_step_ms: list[float] = field(repr=False)
    cost_name: str
    host_counted_ms: float | None = None
    per_step_host_counted_ms: list[float] | None = field(default=None, repr=False)
    host_core_ms: float | None = None
    host_worker_ms: float | None = None
    host_scale: float | None = None
    asynchronous: bool | None = None
    host_path_ms: float | None = None

    @property
    def gpu_ms(self) -> float:
        """The forward passes only (the GPU-only projection): ``total_ms``."""
        return self.total_ms

    def to_dict(self) -> dict[str, Any]:
        """The totals (no per-step lists), JSON-able."""
        return {"gpu_ms": self.total_ms, "host_counted_ms": self.host_counted_ms,
                "host_core_ms": self.host_core_ms, "host_worker_ms": self.host_worker_ms,
                "host_path_ms": self.host_path_ms,
                "host_scale": self.host_scale, "asynchronous": self.asynchronous,
                "steps": self.steps, "cost_name": self.cost_name}


def project(trace: Iterable[tuple[Sequence[int], Sequence[int]]],
            cost: StepCost | str | Mapping[str, Any] | None) -> Projection:
    """Cost every step ``(widths, contexts)`` of ``trace`` (any :func:`load_cost` spec)."""
    model = load_cost(cost)
    per_step = []
    for i, step in enumerate(trace):
        try:
            widths, contexts = step
        except (TypeError, ValueError):
            raise ValueError(f"trace[{i}] must be a (widths, contexts) pair") from None
        per_step.append(model.step_ms(widths, contexts))
    return Projection(math.fsum(per_step), len(per_step), per_step, model.name)
