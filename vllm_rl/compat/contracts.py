"""What vllm_rl's own code relies on in vLLM's internals, besides the patches, as checks.

The patches (``patches/``) each check their own target.  Three other parts of vllm_rl
lean on vLLM internals without patching them; each item here names one thing they rely
on and checks it against vLLM's sources (a :class:`~vllm_rl.compat.source.SourceTree` of
any release, read without importing it, or the installed vLLM):

* ``scheduler.*``: :mod:`vllm_rl.engine.scheduler` (``RLScheduler`` on vLLM's
  ``AsyncScheduler``, ``RLSyncScheduler`` on ``Scheduler``) and the step trace
  (:mod:`vllm_rl.engine.trace`) override ``add_request``, ``update_from_output``,
  ``_free_request`` and ``schedule`` (never a method of vLLM's per-request loop), call
  ``finish_requests``, and build ``EngineCoreOutput`` s.
* ``reload.*``: :func:`vllm_rl.weights.pause_parked` (``/vllm_rl/reload_weights`` and
  ``load_weights_async``) pauses through the engine core's ``pause_scheduler``, which
  queues requests that arrive during the pause (vLLM 0.33's ``pause_generation`` rejects
  them with HTTP 503 in ``abort``/``wait`` mode); the reload itself is the worker's
  ``reload_weights``.
* ``imports``: every ``from vllm... import ...`` of vllm_rl and ``patches/`` resolves.

Each check raises :class:`~vllm_rl.patches.PatchMismatch` naming what moved, or returns a
short note (where vLLM does the thing); ``python -m vllm_rl.compat.check`` prints them.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from vllm_rl.compat.source import (Def, SourceMissing, SourceTree, assignments,
                                   calls, self_attrs_assigned)
from vllm_rl.patches import PatchMismatch

SCHED = "vllm.v1.core.sched.scheduler"
ASYNC = "vllm.v1.core.sched.async_scheduler"
CORE = "vllm.v1.engine.core"
CLIENT = "vllm.v1.engine.core_client"
# vLLM's schedulers that the RL scheduler extends: (module, class), and vllm_rl's class.
BASES = ((ASYNC, "AsyncScheduler"), (SCHED, "Scheduler"))
RL_CLASS = {"AsyncScheduler": "RLScheduler", "Scheduler": "RLSyncScheduler"}


@dataclass(frozen=True)
class Contract:
    name: str
    target: str
    check: Callable[[SourceTree], str | None]


def _where(src: SourceTree) -> str:
    origin = "" if src.label == "installed" else f" at {src.label}"
    return f"in vLLM {src.version}{origin}"


def _method(src: SourceTree, module: str, cls: str, name: str) -> Def:
    try:
        return src.method(module, cls, name)
    except SourceMissing:
        raise PatchMismatch(f"{module}.{cls}.{name} is gone {_where(src)}") from None


def _chain(src: SourceTree, module: str, cls: str, name: str) -> list[Def]:
    found = src.methods(module, cls, name)
    if not found:
        raise PatchMismatch(f"{module}.{cls}.{name} is gone {_where(src)}")
    return found


def _need_params(src, found: Def, what: str, expected: tuple[str, ...],
                 defaults: dict[str, str] | None = None) -> None:
    if found.params[:len(expected)] != expected:
        raise PatchMismatch(f"{what} ({found.owner}) takes {found.params}, not "
                            f"{expected}, {_where(src)}")
    for name, value in (defaults or {}).items():
        if found.defaults.get(name) != value:
            raise PatchMismatch(f"{what} ({found.owner}): {name} defaults to "
                                f"{found.defaults.get(name)}, not {value}, {_where(src)}")


def _short(owner: str) -> str:
    return owner.rsplit(".", 1)[-1]


# ---------------------------------------------------------------------------- scheduler
def scheduler_classes(src: SourceTree) -> str:
    """RLScheduler's MRO: AsyncScheduler is a Scheduler."""
    if not src.is_subclass(ASYNC, "AsyncScheduler", SCHED, "Scheduler"):
        raise PatchMismatch(f"AsyncScheduler no longer subclasses Scheduler {_where(src)}")
    return ""


def scheduler_state(src: SourceTree) -> str:
    """``__init__`` keeps ``vllm_config`` and the ``requests`` dict (read by the mixin's
    ``__init__``, admission and early ends); ``has_unfinished_requests`` (the trace)."""
    attrs = self_attrs_assigned(_method(src, SCHED, "Scheduler", "__init__").node)
    missing = [a for a in ("vllm_config", "requests") if a not in attrs]
    if missing:
        raise PatchMismatch(f"Scheduler.__init__ no longer sets {missing} {_where(src)}")
    for module, cls in BASES:
        _method(src, module, cls, "has_unfinished_requests")
    return ""


def scheduler_add_request(src: SourceTree) -> str:
    """``add_request(self, request)`` files a new request under ``self.requests
    [request.request_id]`` (the mixin admits a request whose id is not there yet; an id
    already there is a streaming continuation)."""
    for module, cls in BASES:
        found = _method(src, module, cls, "add_request")
        _need_params(src, found, f"{cls}.add_request", ("self", "request"))
        stored = [a for a in ast.walk(found.node) if isinstance(a, ast.Assign) and any(
            ast.unparse(t) == "self.requests[request.request_id]" for t in a.targets)]
        if not stored:
            raise PatchMismatch(f"{found.owner}.add_request no longer files the request "
                                f"in self.requests[request.request_id] {_where(src)}")
    return ""


def scheduler_record_before_output(src: SourceTree) -> str:
    """A stopped request goes through ``self._free_request`` (where the mixin writes a
    flagged sample's record into ``request.stop_reason``) before ``update_from_output``
    builds its final ``EngineCoreOutput`` with ``stop_reason=request.stop_reason``."""
    update = _method(src, SCHED, "Scheduler", "update_from_output").node
    frees = [c.lineno for c in calls(update, "_free_request", "self")]
    builds = [n.lineno for n in ast.walk(update)
              if isinstance(n, ast.Call) and ast.unparse(n.func) == "EngineCoreOutput"
              and any(k.arg == "stop_reason" and ast.unparse(k.value) == "request.stop_reason"
                      for k in n.keywords)]
    if not frees or not builds:
        raise PatchMismatch(f"Scheduler.update_from_output no longer frees a stopped request "
                            f"through self._free_request and then emits request.stop_reason "
                            f"in its EngineCoreOutput {_where(src)}")
    if min(frees) > min(builds):
        raise PatchMismatch(f"Scheduler.update_from_output builds the final EngineCoreOutput "
                            f"(line {min(builds)}) before _free_request (line {min(frees)}) "
                            f"{_where(src)}")
    return ""


def scheduler_update_from_output(src: SourceTree) -> str:
    """``update_from_output(self, scheduler_output, model_runner_output)`` returns
    ``dict[int, EngineCoreOutputs]`` (the mixin appends its early ends' outputs by client
    index), and a stopped request gets its finish reason and goes through ``_free_request``."""
    for module, cls in BASES:
        _need_params(src, _method(src, module, cls, "update_from_output"),
                     f"{cls}.update_from_output",
                     ("self", "scheduler_output", "model_runner_output"))
    update = _method(src, SCHED, "Scheduler", "update_from_output").node
    if update.returns is None or ast.unparse(update.returns) != "dict[int, EngineCoreOutputs]":
        raise PatchMismatch(f"Scheduler.update_from_output no longer returns "
                            f"dict[int, EngineCoreOutputs] {_where(src)}")
    stopped = [n for n in ast.walk(update) if isinstance(n, ast.If)
               and isinstance(n.test, ast.Name) and n.test.id == "stopped"]
    if not any(calls(n.body, "get_finished_reason", "request")
               and calls(n.body, "_free_request", "self") for n in stopped):
        raise PatchMismatch(f"Scheduler.update_from_output no longer finishes a stopped "
                            f"request (get_finished_reason, _free_request) {_where(src)}")
    return ""


def scheduler_finish_requests(src: SourceTree) -> str:
    """``finish_requests(self, request_ids, finished_status)`` sets the status, frees each
    request through ``self._free_request`` and returns the list of requests it finished
    (the mixin ends stopped groups' live members with it and emits their outputs)."""
    for module, cls in BASES:
        found = _method(src, module, cls, "finish_requests")
        _need_params(src, found, f"{cls}.finish_requests",
                     ("self", "request_ids", "finished_status"))
    fn = _method(src, SCHED, "Scheduler", "finish_requests").node
    if fn.returns is None or ast.unparse(fn.returns) != "list[Request]":
        raise PatchMismatch(f"Scheduler.finish_requests no longer returns list[Request] "
                            f"{_where(src)}")
    set_status = [a.lineno for a in assignments(fn, "request.status")
                  if ast.unparse(a.value) == "finished_status"]
    frees = [c.lineno for c in calls(fn, "_free_request", "self")]
    if not any(s < f for s in set_status for f in frees):
        raise PatchMismatch(f"Scheduler.finish_requests no longer sets the status and then "
                            f"calls self._free_request {_where(src)}")
    return ""


def scheduler_free_request(src: SourceTree) -> str:
    """``_free_request(self, request, delay_free_blocks=False)`` is where every end
    passes (natural stops in ``update_from_output``, aborts and early ends in
    ``finish_requests``): the mixin's override drops the sample from its group there."""
    for module, cls in BASES:
        _need_params(src, _method(src, module, cls, "_free_request"),
                     f"{cls}._free_request", ("self", "request", "delay_free_blocks"),
                     {"delay_free_blocks": "False"})
    for name in ("update_from_output", "finish_requests"):
        if not calls(_method(src, SCHED, "Scheduler", name).node, "_free_request", "self"):
            raise PatchMismatch(f"Scheduler.{name} no longer frees through "
                                f"self._free_request {_where(src)}")
    return ""


def _need_fields(src: SourceTree, module: str, cls: str, wanted: tuple[str, ...]) -> None:
    try:
        have = src.fields(module, cls)
    except SourceMissing:
        raise PatchMismatch(f"{module}.{cls} is gone {_where(src)}") from None
    missing = [f for f in wanted if f not in have]
    if missing:
        raise PatchMismatch(f"{module}.{cls} has no {missing} {_where(src)}")


def scheduler_types(src: SourceTree) -> str:
    """The fields and methods the mixin and the trace read or build: ``Request``,
    ``RequestStatus``, ``EngineCoreOutput(s)`` (its ``scheduler_stats``, which an early
    end refreshes with ``get_request_counts`` and ``get_kv_cache_usage``),
    ``ModelRunnerOutput``, ``SchedulerOutput``."""
    _need_fields(src, "vllm.v1.request", "Request", (
        "request_id", "sampling_params", "status", "stop_reason", "client_index",
        "trace_headers", "num_output_tokens", "output_token_ids", "prompt_token_ids",
        "max_tokens", "num_computed_tokens", "get_finished_reason", "take_events",
        "is_finished"))
    _need_fields(src, "vllm.v1.request", "RequestStatus",
                 ("RUNNING", "FINISHED_ABORTED", "FINISHED_LENGTH_CAPPED"))
    _need_fields(src, "vllm.v1.engine", "EngineCoreOutput", (
        "request_id", "new_token_ids", "finish_reason", "stop_reason", "events",
        "trace_headers"))
    outputs = [n for n in src.cls("vllm.v1.engine", "EngineCoreOutputs").body
               if isinstance(n, ast.AnnAssign) and ast.unparse(n.target) == "outputs"]
    if not outputs or outputs[0].value is None:
        raise PatchMismatch(f"EngineCoreOutputs() no longer starts with an empty outputs "
                            f"list {_where(src)}")
    _need_fields(src, "vllm.v1.engine", "EngineCoreOutputs", ("scheduler_stats",))
    _need_fields(src, "vllm.v1.metrics.stats", "SchedulerStats", (
        "kv_cache_usage", "num_running_reqs", "num_waiting_reqs", "num_skipped_waiting_reqs"))
    for name in ("get_request_counts", "get_kv_cache_usage"):
        _need_params(src, _method(src, SCHED, "Scheduler", name), f"Scheduler.{name}",
                     ("self",))
    _need_fields(src, "vllm.v1.outputs", "ModelRunnerOutput",
                 ("sampled_token_ids", "req_id_to_index"))
    _need_fields(src, "vllm.v1.core.sched.output", "SchedulerOutput",
                 ("scheduled_spec_decode_tokens", "num_scheduled_tokens",
                  "total_num_scheduled_tokens"))
    for module, cls in BASES:
        _need_params(src, _method(src, module, cls, "schedule"), f"{cls}.schedule", ("self",))
    return ""


# ---------------------------------------------------------------------------- reload pause
def reload_pause_scheduler(src: SourceTree) -> str:
    """The async engine-core client pauses and resumes the scheduler by utility calls
    ``pause_scheduler(mode, clear_cache)`` / ``resume_scheduler``, and ``AsyncLLM``'s
    ``resume_generation`` is that resume."""
    pause = _method(src, CLIENT, "AsyncMPClient", "pause_scheduler_async")
    _need_params(src, pause, "AsyncMPClient.pause_scheduler_async",
                 ("self", "mode", "clear_cache"))
    for found, utility in ((pause, "pause_scheduler"),
                           (_method(src, CLIENT, "AsyncMPClient", "resume_scheduler_async"),
                            "resume_scheduler")):
        if not any(c.args and isinstance(c.args[0], ast.Constant) and c.args[0].value == utility
                   for c in calls(found.node, "call_utility_async", "self")):
            raise PatchMismatch(f"{found.owner}.{found.node.name} no longer calls the engine "
                                f"core's {utility} {_where(src)}")
    resume = _method(src, "vllm.v1.engine.async_llm", "AsyncLLM", "resume_generation")
    if not calls(resume.node, "resume_scheduler_async", "self.engine_core"):
        raise PatchMismatch(f"AsyncLLM.resume_generation no longer resumes the engine core's "
                            f"scheduler {_where(src)}")
    return ""


def reload_parks_requests(src: SourceTree) -> str:
    """The engine core's ``pause_scheduler`` (every mode: abort, wait, keep) leaves new
    requests queued until ``resume_scheduler``: it does not switch on the rejection that
    vLLM 0.33's ``pause_generation`` adds (``reject_new_requests``: HTTP 503)."""
    chain = _chain(src, CORE, "EngineCoreProc", "pause_scheduler")
    _need_params(src, chain[0], "EngineCoreProc.pause_scheduler",
                 ("self", "mode", "clear_cache"))
    if not any(calls(d.node, "set_pause_state", "self.scheduler") for d in chain):
        raise PatchMismatch(f"EngineCoreProc.pause_scheduler no longer pauses the scheduler "
                            f"(set_pause_state) {_where(src)}")
    try:                                     # data-parallel engines, where vLLM has them
        chain = chain + src.methods(CORE, "DPEngineCoreProc", "pause_scheduler")
    except SourceMissing:
        pass
    for d in chain:
        for a in assignments(d.node, "self.reject_new_requests"):
            if not (isinstance(a.value, ast.Constant) and a.value.value is False):
                raise PatchMismatch(f"{d.owner}.pause_scheduler now rejects requests that "
                                    f"arrive during the pause {_where(src)}")
    try:
        generation = src.method(CORE, "EngineCoreProc", "pause_generation")
    except SourceMissing:
        return "pause_generation queues too"
    if assignments(generation.node, "self.reject_new_requests"):
        return "pause_generation would reject (503); pause_scheduler queues"
    return "pause_generation queues too"


def reload_worker(src: SourceTree) -> str:
    """The worker reloads in place: ``Worker.reload_weights`` hands its arguments to the
    model runner's ``reload_weights(self, weights_iterator=None, weights_path=None)``
    (``load_weights``, ``load_weights_async`` and the route call it by those names)."""
    worker = _method(src, "vllm.v1.worker.gpu_worker", "Worker", "reload_weights")
    if not calls(worker.node, "reload_weights", "self.model_runner"):
        raise PatchMismatch(f"Worker.reload_weights no longer calls the model runner's "
                            f"{_where(src)}")
    runner = _method(src, "vllm.v1.worker.gpu_model_runner", "GPUModelRunner",
                     "reload_weights")
    _need_params(src, runner, "GPUModelRunner.reload_weights",
                 ("self", "weights_iterator", "weights_path"),
                 {"weights_iterator": "None", "weights_path": "None"})
    return ""


# ---------------------------------------------------------------------------- imports
PROJECT = Path(__file__).resolve().parents[2]          # the checkout: vllm_rl/, patches/


def project_imports(root: Path = PROJECT) -> list[tuple[str, str, str]]:
    """``(file, module, name)`` for every ``from vllm... import name`` (``name`` empty for
    ``import vllm.x``) in vllm_rl's and ``patches/``'s Python files."""
    out = []
    for folder in ("vllm_rl", "patches"):
        for path in sorted((root / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
            rel = str(path.relative_to(root))
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and not node.level and node.module and (
                        node.module == "vllm" or node.module.startswith("vllm.")):
                    out.extend((rel, node.module, a.name) for a in node.names)
                elif isinstance(node, ast.Import):
                    out.extend((rel, a.name, "") for a in node.names
                               if a.name == "vllm" or a.name.startswith("vllm."))
    return out


def imports_resolve(src: SourceTree) -> str:
    """Every vLLM module and name that vllm_rl imports exists in these sources."""
    imports = project_imports()
    broken = []
    for path, module, name in imports:
        if not src.has_module(module):
            broken.append(f"{module} ({path})")
        elif name and name != "*" and not src.defines(module, name):
            broken.append(f"{module}.{name} ({path})")
    if broken:
        raise PatchMismatch(f"{len(broken)} vLLM imports no longer resolve {_where(src)}: "
                            + ", ".join(sorted(set(broken))))
    return f"{len(imports)} imports"


SCHEDULER = (
    Contract("scheduler.classes", f"{ASYNC}.AsyncScheduler", scheduler_classes),
    Contract("scheduler.state", f"{SCHED}.Scheduler.__init__", scheduler_state),
    Contract("scheduler.add_request", f"{SCHED}.Scheduler.add_request", scheduler_add_request),
    Contract("scheduler.record_before_output", f"{SCHED}.Scheduler.update_from_output",
             scheduler_record_before_output),
    Contract("scheduler.update_from_output", f"{SCHED}.Scheduler.update_from_output",
             scheduler_update_from_output),
    Contract("scheduler.finish_requests", f"{SCHED}.Scheduler.finish_requests",
             scheduler_finish_requests),
    Contract("scheduler.free_request", f"{SCHED}.Scheduler._free_request",
             scheduler_free_request),
    Contract("scheduler.types", "Request, EngineCoreOutput(s), SchedulerOutput, ...",
             scheduler_types),
)
RELOAD = (
    Contract("reload.pause_scheduler", f"{CLIENT}.AsyncMPClient.pause_scheduler_async",
             reload_pause_scheduler),
    Contract("reload.parks_requests", f"{CORE}.EngineCoreProc.pause_scheduler",
             reload_parks_requests),
    Contract("reload.worker", "vllm.v1.worker.gpu_worker.Worker.reload_weights", reload_worker),
)
IMPORTS = (Contract("imports", "from vllm... import in vllm_rl/, patches/", imports_resolve),)
ALL = SCHEDULER + RELOAD + IMPORTS


def check(source: SourceTree | None = None, contracts=ALL) -> None:
    """Raise :class:`PatchMismatch` at the first contract the sources break (default:
    the installed vLLM)."""
    from vllm_rl.patches import source_of

    src = source_of(source)
    for contract in contracts:
        contract.check(src)
