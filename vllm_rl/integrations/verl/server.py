"""verl's vLLM server and replica on the RL engine.

:class:`RLHttpServer` is verl's ``vLLMHttpServer`` (a Ray actor owning vLLM's
``AsyncLLM`` and its HTTP app) with four changes, each through one of verl's hook methods:

* the engine is the RL engine: ``_preprocess_engine_kwargs`` adds
  :class:`vllm_rl.settings.EngineSettings` from ``rollout.engine_kwargs.vllm_rl`` (``das``,
  ``arrol``, ``cost``, ``trace``) to verl's own ``rollout.engine_kwargs.vllm``;
* the worker extension is :class:`.worker.VerlRLWorkerExtension`, verl's weight-sync
  extension and vllm_rl's DAS / ARRoL methods in one class;
* each sample's record travels back: ``TokenOutput.extra_fields["vllm_rl"]`` holds the
  :class:`~vllm_rl.outcome.RolloutInfo` wire string (``RolloutInfo.decode`` reads it);
* a sample the engine ended on purpose (DARTS cancelled, DUET aborted, ARRoL pruned,
  carried to the next step) comes back with ``stop_reason="vllm_rl_<reason>"``, never
  ``"aborted"``: verl's client re-submits an aborted request as unfinished work, and
  these are finished (a carried one goes on as the trainer's continuation, next step).
  A request aborted by verl itself (``abort_all_requests``) stays ``"aborted"``;
* ``end_step(step)``: partial rollouts end a trainer step on this replica
  (:mod:`.partial`).

:class:`RLReplica` is verl's ``vLLMReplica`` with this server and the actor-name prefix
``vllm_rl_`` that verl's ``ServerAdapter`` derives from ``rollout.name``.
"""
from __future__ import annotations

from typing import Any

from vllm_rl.compat import vllm_version_shim

vllm_version_shim()

import ray  # noqa: E402
from verl.workers.rollout.vllm_rollout.vllm_async_server import (  # noqa: E402
    vLLMHttpServer,
    vLLMReplica,
)

from vllm_rl.integrations.common.rpc import RLStateRPC  # noqa: E402
from vllm_rl.integrations.verl.keys import NAME, RECORD_KEY, SETTINGS_KEY  # noqa: E402
from vllm_rl.integrations.common.partial import end_step_async  # noqa: E402
from vllm_rl.outcome import Reason, record_of  # noqa: E402

ENGINE_SETTINGS = ("das", "arrol", "cost", "trace")
TRAINER_SETTINGS = ("flags", "policy", "partial")      # read by the agent loop and trainer
WORKER_EXTENSION = "vllm_rl.integrations.verl.worker.VerlRLWorkerExtension"


def engine_settings(rollout_config) -> dict[str, Any]:
    """The RL engine settings under ``rollout.engine_kwargs.vllm_rl`` (plain dicts)."""
    raw = (rollout_config.get("engine_kwargs", {}) or {}).get(SETTINGS_KEY) or {}
    try:
        from omegaconf import OmegaConf

        if OmegaConf.is_config(raw):
            raw = OmegaConf.to_container(raw, resolve=True)
    except ImportError:
        pass
    return dict(raw)


def rl_kwargs(settings: dict[str, Any]) -> dict[str, Any]:
    """vLLM engine keywords for the engine settings (the worker extension left to verl's
    hook, which combines both extensions)."""
    from vllm_rl.settings import EngineSettings

    kwargs = EngineSettings.of(**{k: settings.get(k) for k in ENGINE_SETTINGS}).engine_kwargs()
    kwargs.pop("worker_extension_cls", None)
    return kwargs


class _FinalOutputs:
    """The server's ``AsyncLLM``, keeping the last ``RequestOutput`` of each ``generate``
    by request id (verl's ``generate`` reads the tokens and drops the rest of vLLM's
    ``CompletionOutput``, its ``rollout_info`` included).

    It also answers verl 0.9.1's ``pause_generation(wait_for_inflight_requests=...)``
    (written for vLLM 0.24) with vLLM 0.32's ``pause_generation(mode=...)``: without it
    verl's ``abort_all_requests`` (every weight sync, every partial-rollout pause) fails
    with a ``TypeError`` on vLLM 0.32.
    """

    def __init__(self, engine) -> None:
        self._engine = engine
        self.finals: dict[str, Any] = {}

    def __getattr__(self, name: str):
        return getattr(self._engine, name)

    async def generate(self, *args, request_id: str, **kwargs):
        async for output in self._engine.generate(*args, request_id=request_id, **kwargs):
            self.finals[request_id] = output
            yield output

    async def pause_generation(self, *, wait_for_inflight_requests: bool | None = None,
                               mode: str | None = None, clear_cache: bool = True) -> None:
        if mode is None:
            mode = "wait" if wait_for_inflight_requests else "abort"
        await self._engine.pause_generation(mode=mode, clear_cache=clear_cache)


def with_record(output, final) -> Any:
    """Put the record of ``final`` (vLLM's last ``RequestOutput``) into the
    ``TokenOutput``; an early end the engine chose is not an abort."""
    if final is None or not final.outputs:
        return output
    info = record_of(final.outputs[0])
    if info is None:                     # a request without flags: stock vLLM's answer
        return output
    output.extra_fields[RECORD_KEY] = info.encode()
    if info.reason is not Reason.ABORT and output.stop_reason == "aborted":
        output.stop_reason = f"vllm_rl_{info.reason.value}"
    return output


class RLHttpServer(RLStateRPC, vLLMHttpServer):
    """verl's vLLM server actor on the RL engine (see the module docstring)."""

    def _preprocess_engine_kwargs(self, engine_kwargs: dict) -> None:
        super()._preprocess_engine_kwargs(engine_kwargs)
        settings = engine_settings(self.config)
        unknown = set(settings) - set(ENGINE_SETTINGS) - set(TRAINER_SETTINGS)
        if unknown:
            raise ValueError(f"rollout.engine_kwargs.{SETTINGS_KEY}: unknown keys "
                             f"{sorted(unknown)}; allowed {[*ENGINE_SETTINGS, *TRAINER_SETTINGS]}")
        if settings.get("arrol"):
            from vllm_rl.arrol.config import use_v1_runner

            use_v1_runner()              # this actor owns one engine: process-wide is scoped
        for key, value in rl_kwargs(settings).items():
            if key == "additional_config":
                value = {**(engine_kwargs.get(key) or {}), **value}
            elif engine_kwargs.get(key) not in (None, value):
                raise ValueError(f"rollout.engine_kwargs.vllm.{key}={engine_kwargs[key]!r} "
                                 f"conflicts with the RL engine's {key}={value!r}")
            engine_kwargs[key] = value

    def _get_worker_extension_cls(self) -> str:
        return WORKER_EXTENSION

    async def run_server(self, args) -> None:
        await super().run_server(args)
        self.engine = _FinalOutputs(self.engine)

    async def generate(self, prompt_ids, sampling_params, request_id, **kwargs):
        try:
            output = await super().generate(prompt_ids, sampling_params, request_id, **kwargs)
            final = self._finals().get(request_id)
        finally:
            self._finals().pop(request_id, None)
        return with_record(output, final)

    def _finals(self) -> dict:
        return self.engine.finals if isinstance(self.engine, _FinalOutputs) else {}

    # -- RL state on the workers (results returned, unlike verl's collective_rpc) ------
    async def rl_rpc(self, method: str, args: tuple = ()) -> Any:
        """Call a :class:`vllm_rl.worker.RLWorkerExtension` method; rank 0's answer."""
        return (await self.engine.collective_rpc(method, args=tuple(args)))[0]

    def rl_vllm_config(self) -> Any:
        """The running engine's config (ARRoL updates checked against its head)."""
        return getattr(getattr(self, "engine", None), "vllm_config", None)

    async def end_step(self, step: int) -> int:
        """End trainer step ``step`` on this replica (partial rollouts: the trainer
        counted enough finished groups); how many samples it carries."""
        return await end_step_async(self.engine, step)

    async def num_unfinished_requests(self) -> int:
        """Requests the front end still holds (0 once aborts have drained)."""
        return len(self.engine.output_processor.request_states)


class RLReplica(vLLMReplica):
    """verl's vLLM replica with :class:`RLHttpServer` actors named ``vllm_rl_server_*``."""

    def __init__(self, *args, **kwargs) -> None:
        from vllm_rl.integrations.verl.checks import check_registered

        check_registered()
        super().__init__(*args, **kwargs)
        self.server_class = ray.remote(RLHttpServer)

    def _get_server_name_prefix(self) -> str:
        return f"{NAME}_"
