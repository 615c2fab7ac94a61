"""One table of the RL engine's RPC methods: what each takes, how it is checked, where it
is served.

The RL state lives with the model runner in the worker process: the DAS drafter's trees
(:mod:`vllm_rl.das.worker`) and ARRoL's head and kept hidden states
(:mod:`vllm_rl.arrol.worker`).  vLLM reaches a worker method with ``collective_rpc``, run
between steps.  Each :class:`Method` says once what the method takes and where it is
served.  A method is declared once: its signature is the worker's own method (the
class its ``owner`` names, where ``collective_rpc`` lands), its docstring is the table's
``doc`` (what a caller gets).  Every other way to call it is generated from that
declaration (:func:`rpc_methods`), never written out again:

* the worker extension, :class:`vllm_rl.worker.RLWorkerExtension` (a subclass of the
  classes named by the methods' ``owner``);
* ``vllm_rl.LLM``'s methods (:class:`vllm_rl.llm.LLM`, ``@rpc_methods()``);
* the framework actors' async methods (verl's ``RLHttpServer``, OpenRLHF's
  ``RLRolloutActor``: :class:`vllm_rl.integrations.common.rpc.RLStateRPC`,
  ``@rpc_methods(is_async=True)``);
* the server's HTTP routes (:mod:`vllm_rl.endpoint`).

A method's arguments go through :meth:`Method.call_args` on every path (token ids as
ints, a calibration object as its dict, request ids as strings; an ARRoL update checked
whole, and against the engine's head dims where the path knows the engine:
:meth:`Method.engine_call_args`), so a client never sends the worker something it would
not take from another, and a bad update fails before any worker sees it.  ``rank0``: the
result is rank 0's (every rank holds the same state).
"""
from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Callable, Mapping

from vllm_rl.arrol.hidden import hidden_from_wire, hidden_to_wire

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


def _request_ids(args: dict[str, Any], vllm_config: Any = None) -> dict[str, Any]:
    """A list of request id strings (the records' ``hidden_id``); a bare string is
    refused, not read as its characters."""
    ids = args["request_ids"]
    if isinstance(ids, (str, bytes)) or not hasattr(ids, "__iter__"):
        raise ValueError(f"arrol_hidden: request_ids={ids!r}: allowed a list of request id "
                         "strings (RolloutInfo.hidden_id)")
    ids = list(ids)
    if not all(isinstance(i, str) for i in ids):
        raise ValueError("arrol_hidden: request_ids: allowed a list of request id strings "
                         "(RolloutInfo.hidden_id)")
    return {**args, "request_ids": ids}


def _hidden_json(result: Mapping[str, Any]) -> dict[str, str]:
    """The vectors as JSON: base64 of float32 little-endian per id
    (:func:`vllm_rl.outcome.decode_hidden` reads one)."""
    from vllm_rl.outcome import encode_hidden

    return {rid: encode_hidden(h) for rid, h in result.items()}


@dataclass(frozen=True)
class Method:
    """One RPC: its name on the worker, the worker class that implements it (whose method
    is the signature), what a caller gets (``doc``), the HTTP route, the key the route
    returns the result under (None: the result is the response body), how a caller reads
    one rank's result (``from_worker``; None: as it is) and how the route writes it as
    JSON (``to_json``; None: as it is)."""

    name: str
    owner: str
    doc: str
    http: tuple[str, str]                      # (verb, path)
    result_key: str | None = None
    prepare: Callable[[dict[str, Any], Any], dict[str, Any]] | None = None   # (args, vllm_config)
    rank0: bool = True
    http_extra: tuple[str, ...] = field(default_factory=tuple)   # route-only body keys
    from_worker: Callable[[Any], Any] | None = None              # one rank's result, read
    to_json: Callable[[Any], Any] | None = None                  # the route's answer

    @cached_property
    def signature(self) -> inspect.Signature:
        """The worker method's signature (``owner``'s), ``self`` included."""
        module, _, cls = self.owner.rpartition(".")
        return inspect.signature(getattr(getattr(importlib.import_module(module), cls),
                                         self.name))

    @property
    def params(self) -> tuple[str, ...]:
        return tuple(self.signature.parameters)[1:]

    @property
    def defaults(self) -> dict[str, Any]:
        return {p.name: p.default for p in list(self.signature.parameters.values())[1:]
                if p.default is not p.empty}

    @property
    def required(self) -> tuple[str, ...]:
        return tuple(p for p in self.params if p not in self.defaults)

    def front_end(self, is_async: bool) -> Callable:
        """This method on a front end: checked like a Python call, then
        ``self._rl_call(name, *args, **kwargs)`` (awaited if ``is_async``), with the
        worker's signature and the table's docstring."""
        name = self.name
        if is_async:
            async def method(self, *args, **kwargs):
                return await self._rl_call(name, *args, **kwargs)
        else:
            def method(self, *args, **kwargs):
                return self._rl_call(name, *args, **kwargs)
        method.__name__ = name
        method.__doc__ = self.doc
        method.__signature__ = self.signature
        return method

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

    def read(self, value: Any) -> Any:
        """One rank's result as a caller gets it (``from_worker``)."""
        return value if self.from_worker is None else self.from_worker(value)

    def result(self, out: list[Any]) -> Any:
        """What a caller gets from ``collective_rpc``'s per-rank list: rank 0's result
        (``rank0``) or every rank's, each :meth:`read`."""
        return self.read(out[0]) if self.rank0 else [self.read(v) for v in out]


METHODS: tuple[Method, ...] = (
    Method("das_prebuild", DAS_WORKER,
           "Fill a problem's DAS tree with past rollouts (output token ids; over HTTP also "
           "texts, and a 'prompt' text); returns how many were added.",
           ("POST", "/vllm_rl/das/prebuild"), "rollouts", _prebuild, http_extra=("prompt",)),
    Method("das_clear", DAS_WORKER,
           "Drop one problem's DAS tree, or every tree; returns how many were dropped.",
           ("POST", "/vllm_rl/das/clear"), "dropped"),
    Method("das_stats", DAS_WORKER,
           "The DAS drafter's trees, memory, and acceptance (totals and per step).",
           ("GET", "/vllm_rl/das/stats")),
    Method("das_phase", DAS_WORKER,
           "The drafter's recent phase-aware decisions (batch_cap='phase').",
           ("GET", "/vllm_rl/das/phase")),
    Method("arrol_update", ARROL_WORKER,
           "Load ARRoL head weights (QualityHead.export, or a path to them) and/or a "
           "calibration (Calibration or its dict) between steps; cold_start=True goes back "
           "to scoring without pruning.  Checked whole, and against the engine's head and "
           "hidden size where the caller knows the engine, before any worker sees it "
           "(ValueError).  Returns the head version every record scored from the next "
           "step on names.",
           ("POST", "/vllm_rl/arrol"), "version", _arrol_update),
    Method("arrol_info", ARROL_WORKER,
           "ARRoL's head: version, shape, calibration, samples scored and pruned.",
           ("GET", "/vllm_rl/arrol")),
    Method("arrol_hidden", ARROL_WORKER,
           "Take the hidden states at l_detect kept on the worker for these records "
           "(arrol.return_hidden; the ids are the records' hidden_id): request id -> "
           "float32 vector, ids not kept (or already taken) absent.  Over HTTP: base64 of "
           "float32 little-endian per id (vllm_rl.outcome.decode_hidden).",
           ("POST", "/vllm_rl/arrol/hidden"), "hidden", _request_ids,
           from_worker=hidden_from_wire, to_json=_hidden_json),
)
BY_NAME = {m.name: m for m in METHODS}


def rpc_methods(is_async: bool = False) -> Callable[[type], type]:
    """A class decorator: every method of :data:`METHODS` on a front end that defines
    ``_rl_call(name, *args, **kwargs)`` (generated, :meth:`Method.front_end`; a method
    the class writes itself is kept)."""
    def add(cls: type) -> type:
        for m in METHODS:
            if m.name not in vars(cls):
                fn = m.front_end(is_async)
                fn.__qualname__ = f"{cls.__qualname__}.{m.name}"
                fn.__module__ = cls.__module__
                setattr(cls, m.name, fn)
        return cls
    return add

__all__ = ["ARROL_WORKER", "BY_NAME", "DAS_WORKER", "METHODS", "Method", "hidden_from_wire",
           "hidden_to_wire", "rpc_methods"]
