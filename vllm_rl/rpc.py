"""One table of the RL engine's RPC methods, from which every way to call them is built.

The RL state lives with the model runner in the worker process: the DAS drafter's trees
(:mod:`vllm_rl.das.worker`) and ARRoL's head (:mod:`vllm_rl.arrol.worker`).  vLLM reaches a
worker method with ``collective_rpc``, run between steps.  Each :class:`Method` says once
what the method takes and where it is served; from :data:`METHODS`:

* the worker extension (:class:`vllm_rl.worker.RLWorkerExtension`) is the classes named
  by the methods' ``owner``;
* ``vllm_rl.LLM`` gets one method each (:func:`bind_sync`);
* the framework actors (verl's ``RLHttpServer``, OpenRLHF's ``RLRolloutActor``) get one
  async method each (:class:`vllm_rl.integrations.common.rpc.RLStateRPC`);
* the server gets one HTTP route each (:mod:`vllm_rl.endpoint`).

A method's arguments go through :meth:`Method.call_args` on every path (token ids as
ints, a calibration object as its dict; an ARRoL update checked whole, and against the
engine's head dims where the path knows the engine: :meth:`Method.engine_call_args`),
so a client never sends the worker something it would not take from another, and a bad
update fails before any worker sees it.  ``rank0``: the result is rank 0's (every rank holds the
same state).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

DAS_WORKER = "vllm_rl.das.worker.DASWorkerExtension"
ARROL_WORKER = "vllm_rl.arrol.worker.ArrolWorkerExtension"


def _ints(value: Any) -> list[int] | None:
    return None if value is None else [int(t) for t in value]


def _prebuild(args: dict[str, Any], vllm_config: Any = None) -> dict[str, Any]:
    return {**args, "problem_id": str(args["problem_id"]),
            "rollouts": [_ints(r) for r in args["rollouts"]],
            "prompt_token_ids": _ints(args.get("prompt_token_ids"))}


def _arrol_update(args: dict[str, Any], vllm_config: Any = None) -> dict[str, Any]:
    """Checked before any worker sees it (a head path loaded, a calibration object as
    its dict; with the engine's config, its head and hidden size): a bad update is a
    ValueError here, a 400 over HTTP, never a worker's traceback."""
    from vllm_rl.arrol.config import check_update

    return {**args, **check_update(args.get("head"), args.get("calibration"),
                                   args.get("cold_start", False), args.get("version"),
                                   vllm_config=vllm_config)}


@dataclass(frozen=True)
class Method:
    """One RPC: its name on the worker, its parameters (in order) with defaults, the
    worker class that implements it, the HTTP route, and the key the route returns the
    result under (None: the result is the response body)."""

    name: str
    params: tuple[str, ...]
    defaults: Mapping[str, Any]
    owner: str
    doc: str
    http: tuple[str, str]                      # (verb, path)
    result_key: str | None = None
    prepare: Callable[[dict[str, Any], Any], dict[str, Any]] | None = None   # (args, vllm_config)
    rank0: bool = True
    http_extra: tuple[str, ...] = field(default_factory=tuple)   # route-only body keys

    @property
    def required(self) -> tuple[str, ...]:
        return tuple(p for p in self.params if p not in self.defaults)

    def call_args(self, *args: Any, **kwargs: Any) -> tuple:
        """The worker's positional arguments from a Python call (checked like one)."""
        return self.engine_call_args(None, *args, **kwargs)

    def engine_call_args(self, vllm_config: Any, *args: Any, **kwargs: Any) -> tuple:
        """:meth:`call_args`, checked also against the engine's ``vllm_config`` where the
        method has such checks (``arrol_update``: the engine has a head, the head's
        hidden size is the model's); ``vllm_config=None``: the engine-free checks only."""
        if len(args) > len(self.params):
            raise TypeError(f"{self.name}() takes {len(self.params)} arguments "
                            f"({', '.join(self.params)}), got {len(args)}")
        given = dict(zip(self.params, args))
        for key, value in kwargs.items():
            if key not in self.params:
                raise TypeError(f"{self.name}() got an unexpected argument {key!r}; "
                                f"takes {', '.join(self.params) or 'none'}")
            if key in given:
                raise TypeError(f"{self.name}() got {key!r} twice")
            given[key] = value
        missing = [p for p in self.required if p not in given]
        if missing:
            raise TypeError(f"{self.name}() missing {', '.join(missing)}")
        values = {p: given.get(p, self.defaults.get(p)) for p in self.params}
        if self.prepare is not None:
            values = self.prepare(values, vllm_config)
        return tuple(values[p] for p in self.params)


METHODS: tuple[Method, ...] = (
    Method("das_prebuild", ("problem_id", "rollouts", "prompt_token_ids"),
           {"prompt_token_ids": None}, DAS_WORKER,
           "Fill a problem's DAS tree with past rollouts (output token ids; over HTTP also "
           "texts, and a 'prompt' text); returns how many were added.",
           ("POST", "/vllm_rl/das/prebuild"), "rollouts", _prebuild, http_extra=("prompt",)),
    Method("das_clear", ("problem_id",), {"problem_id": None}, DAS_WORKER,
           "Drop one problem's DAS tree, or every tree; returns how many were dropped.",
           ("POST", "/vllm_rl/das/clear"), "dropped"),
    Method("das_stats", (), {}, DAS_WORKER,
           "The DAS drafter's trees, memory, and acceptance (totals and per step).",
           ("GET", "/vllm_rl/das/stats")),
    Method("das_phase", (), {}, DAS_WORKER,
           "The drafter's recent phase-aware decisions (batch_cap='phase').",
           ("GET", "/vllm_rl/das/phase")),
    Method("arrol_update", ("head", "calibration", "cold_start", "version"),
           {"head": None, "calibration": None, "cold_start": False, "version": None},
           ARROL_WORKER,
           "Load ARRoL head weights (QualityHead.export) and/or a calibration between "
           "steps; cold_start=True goes back to scoring without pruning.  Returns the head "
           "version every record scored from the next step on names.",
           ("POST", "/vllm_rl/arrol"), "version", _arrol_update),
    Method("arrol_info", (), {}, ARROL_WORKER,
           "ARRoL's head: version, shape, calibration, samples scored and pruned.",
           ("GET", "/vllm_rl/arrol")),
)
BY_NAME = {m.name: m for m in METHODS}


def owners() -> list[type]:
    """The worker classes implementing the table, in table order."""
    import importlib

    out: list[type] = []
    for m in METHODS:
        module, _, name = m.owner.rpartition(".")
        cls = getattr(importlib.import_module(module), name)
        if cls not in out:
            out.append(cls)
    return out


def bind_sync(cls: type) -> type:
    """Give ``cls`` (a ``vllm.LLM``) one method per table entry: ``collective_rpc`` with
    the checked arguments, rank 0's result."""
    for method in METHODS:
        def call(self, *args, _m=method, **kwargs):
            config = getattr(getattr(self, "llm_engine", None), "vllm_config", None)
            out = self.collective_rpc(_m.name, args=_m.engine_call_args(config, *args,
                                                                         **kwargs))
            return out[0] if _m.rank0 else out

        call.__name__ = call.__qualname__ = method.name
        call.__doc__ = method.doc
        setattr(cls, method.name, call)
    return cls


__all__ = ["BY_NAME", "METHODS", "Method", "bind_sync", "owners"]
