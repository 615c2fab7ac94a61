"""What makes a vLLM engine the RL engine, as one object: :class:`EngineSettings`.

The same settings reach vLLM three ways, and all three are derived here:

* :meth:`EngineSettings.engine_kwargs`: engine keywords for ``vllm_rl.LLM``,
  ``AsyncEngineArgs`` (:func:`vllm_rl.engine_args`) and the frameworks that build their
  own engine arguments (verl's server, OpenRLHF's actor);
* :meth:`EngineSettings.cli_args`: the same as ``vllm serve`` flags (``vllm-rl serve``,
  :func:`vllm_rl.server_args`);
* :meth:`EngineSettings.env`: what the engine's processes need in their environment
  (ARRoL: vLLM's V1 model runner).

The settings: ``das`` (the DAS drafter, :class:`~vllm_rl.das.config.DASConfig`), ``arrol``
(ARRoL's head, :class:`~vllm_rl.arrol.config.ArrolConfig`), ``cost`` (the step-cost model the
engine plans with, a :func:`vllm_rl.cost.load_cost` spec) and ``trace`` (record every
engine step, :mod:`vllm_rl.engine.trace`).  Every engine gets the RL scheduler
(:class:`~vllm_rl.engine.scheduler.RLScheduler` with async scheduling, or
:class:`~vllm_rl.engine.scheduler.RLSyncScheduler` where vLLM schedules synchronously: on
its CPU platform, and with a CPU-side drafter) and the worker extension
(:data:`vllm_rl.WORKER_EXTENSION_CLS`: the RL state's RPCs and weight reloads).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from vllm_rl.arrol.config import RUNNER_ENV
from vllm_rl.class_paths import (ENGINE_ENV, SCHEDULER_CLS, SYNC_SCHEDULER_CLS,
                                 WORKER_EXTENSION_CLS)
from vllm_rl.engine import TRACE_KEY   # additional_config: record each engine step (trace)
from vllm_rl.patches.config import CPU_ASYNC_KEY   # additional_config: async on vLLM's CPU
from vllm_rl.plugin import enable

COST_KEY = "vllm_rl_cost"      # additional_config: the StepCost spec (vllm_rl.cost.load_cost)


def on_cpu() -> bool:
    """vLLM's CPU platform, which runs every engine with synchronous scheduling (stock vLLM
    there is the plain ``Scheduler``): the RL engine takes ``RLSyncScheduler`` to match."""
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


@dataclass(frozen=True)
class EngineSettings:
    """The RL engine's settings (module docstring).  Build with :meth:`of`, which takes
    what ``vllm_rl.LLM(das=..., arrol=..., cost=..., trace=...)`` takes."""

    das: Any = None          # DASConfig | None
    arrol: Any = None        # ArrolConfig | None
    cost: Any = None         # a load_cost spec, or None
    trace: bool = False

    @classmethod
    def of(cls, das: Any = None, arrol: Any = None, cost: Any = None,
           trace: bool = False) -> "EngineSettings":
        """Settings from user values: ``das``/``arrol`` True, a dict of fields or a config
        object (falsy: off); ``cost`` any :func:`vllm_rl.cost.load_cost` spec, checked
        here so a bad one fails at the call, not in the worker."""
        if das:
            from vllm_rl.das.config import DASConfig

            das = DASConfig.of(das)
        if arrol:
            from vllm_rl.arrol.config import ArrolConfig

            arrol = ArrolConfig.of(arrol)
        if cost is not None:
            from vllm_rl.cost import load_cost

            load_cost(cost)
        return cls(das or None, arrol or None, cost, bool(trace))

    # ------------------------------------------------------------------ derived
    def additional_config(self) -> dict[str, Any]:
        extra: dict[str, Any] = {}
        if self.trace:
            extra[TRACE_KEY] = True
        if self.cost is not None:
            extra[COST_KEY] = self.cost
        if self.das is not None:
            extra.update(self.das.engine_kwargs()["additional_config"])
        if self.arrol is not None:
            extra.update(self.arrol.engine_kwargs()["additional_config"])
        return extra

    def scheduling(self, additional_config: dict | None = None) -> dict[str, Any]:
        """``scheduler_cls`` and ``async_scheduling``: asynchronous, as stock vLLM on a
        GPU, unless DAS asks for synchronous scheduling (``DASConfig.async_scheduling``
        off) or the engine runs on vLLM's CPU platform, which schedules every engine
        synchronously unless ``additional_config`` has ``vllm_rl_async_cpu: true``
        (``patches/model_runner/das_async.py``)."""
        sync = (self.das is not None and not self.das.async_scheduling) or \
            (on_cpu() and not (additional_config or {}).get(CPU_ASYNC_KEY))
        return {"scheduler_cls": SYNC_SCHEDULER_CLS if sync else SCHEDULER_CLS,
                "async_scheduling": not sync}

    def engine_kwargs(self, base: dict[str, Any] | None = None) -> dict[str, Any]:
        """vLLM engine keywords: ``base`` (a caller's own, which win where they are set,
        e.g. a framework's ``worker_extension_cls`` combining ours) plus the RL engine's.
        A conflict with what DAS needs raises ValueError naming the keyword.

        The caller builds an RL engine with them, so this process and the ones it starts
        get vllm_rl's patches (:func:`vllm_rl.plugin.enable`)."""
        enable()
        out = dict(base or {})
        extra = self.additional_config()
        if extra:
            out["additional_config"] = {**(out.get("additional_config") or {}), **extra}
        if self.das is not None:
            for key, value in self.das.engine_kwargs().items():
                if key == "additional_config":
                    continue
                if key in out and out[key] != value:
                    raise ValueError(f"das= sets {key}={value!r}; got {out[key]!r}")
                out[key] = value
        asked = out.get("async_scheduling")
        if asked is not None:                       # the caller's own choice, kept whole
            if asked and self.das is not None and not self.das.async_scheduling:
                raise ValueError("das={'async_scheduling': False} schedules synchronously; "
                                 "got async_scheduling=True")
            out.setdefault("scheduler_cls", SCHEDULER_CLS if asked else SYNC_SCHEDULER_CLS)
        for key, value in self.scheduling(out.get("additional_config")).items():
            out.setdefault(key, value)
        out.setdefault("worker_extension_cls", WORKER_EXTENSION_CLS)
        return out

    def cli_args(self) -> list[str]:
        """The same settings as ``vllm serve`` flags."""
        sched = self.scheduling()
        args = ["--scheduler-cls", sched["scheduler_cls"],
                "--async-scheduling" if sched["async_scheduling"] else "--no-async-scheduling"]
        if self.das is not None:
            spec = self.das.engine_kwargs()["speculative_config"]
            args += ["--speculative-config", json.dumps(spec)]
        extra = self.additional_config()
        if extra:
            args += ["--additional-config", json.dumps(extra)]
        return args + ["--worker-extension-cls", WORKER_EXTENSION_CLS]

    def env(self) -> dict[str, str]:
        """Environment the engine's processes need: vllm_rl's patches
        (:data:`~vllm_rl.class_paths.ENGINE_ENV`), and with ARRoL vLLM's V1 model runner
        (the one ``patches/model_runner/arrol_capture.py`` patches)."""
        env = {ENGINE_ENV: "1"}
        if self.arrol is not None:
            env[RUNNER_ENV] = "0"
        return env


__all__ = ["COST_KEY", "CPU_ASYNC_KEY", "EngineSettings", "TRACE_KEY", "on_cpu"]
