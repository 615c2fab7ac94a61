"""OpenRLHF's rollout actor on the RL engine.

:class:`RLRolloutActor` is OpenRLHF's ``RolloutRayActor`` (same constructor, same
methods: ``generate_responses``, ``generate``, ``get_num_unfinished_requests``,
``init_process_group``, ``update_weight``, ``update_weight_cuda_ipc``,
``reset_prefix_cache``, ``sleep``, ``wake_up``, ``pause_generation``,
``resume_generation``) with these changes:

* the engine is the RL engine: :class:`vllm_rl.settings.EngineSettings` from the settings'
  ``das`` / ``arrol`` / ``cost`` / ``trace`` join OpenRLHF's engine keywords, the
  settings' ``engine`` keywords override OpenRLHF's (e.g. ``dtype`` on a CPU), and the
  worker extension is :class:`.worker.OpenRLHFRLWorkerExtension` (OpenRLHF's weight sync
  and vllm_rl's DAS / ARRoL methods);
* ``generate_responses`` (one call per prompt, ``num_samples`` samples) gives the samples
  of the call one group: ``group.id`` fresh per call, ``redundant`` = ``num_samples``,
  ``size`` = the flags' ``group.size`` or ``num_samples``; ``das.problem_id`` =
  ``"prompt:<sha1 of the prompt text>"`` (stable across steps), when the engine has a
  drafter.  The flags come from the policy of :mod:`vllm_rl.integrations.common.policy`
  (``StaticPolicy`` unless the settings name one) and go on the first engine request of
  each sample (a multi-turn executor's later turns run as on stock vLLM);
* every response dict comes back with its record and flags and with the training marks
  of :mod:`.records` applied (``action_ranges`` emptied for a sample that leaves the loss;
  ``extra_logs`` carrying the weight, which reaches ``Experience.info``); with ARRoL's
  ``return_hidden`` also the hidden states at ``l_detect``, taken from the workers in one
  ``arrol_hidden`` call per ``generate_responses`` call;
* partial rollouts (:mod:`.partial`): ``generate_responses`` takes the step's
  ``partial`` flags, ``continue_responses`` continues a carried group's samples through
  OpenRLHF's executor (the engine gets the prompt and the tokens so far; the executor
  sees the whole sample), ``end_step`` ends a step on this engine;
* ``update_weight`` / ``update_weight_cuda_ipc``: at the last parameter of a sync
  (OpenRLHF's ``empty_cache=True``) the weight sync's cache side follows the load
  (:func:`vllm_rl.weights.weight_sync_async`).  OpenRLHF resets the prefix cache
  *before* it broadcasts the weights, so a block computed between that reset and the
  load would otherwise stay cached under the new weights;
* ``pause_generation`` / ``resume_generation`` / ``reset_prefix_cache`` are OpenRLHF's;
  the DAS trees, the ARRoL head and DUET's online thresholds stay across them and across
  weight syncs.  Added: the RL state's methods of :class:`~vllm_rl.integrations.common.rpc.RLStateRPC`
  (``das_*``, ``arrol_update``, ``arrol_info``, ``arrol_hidden``; rank 0's answer,
  checked against the engine first), ``flush_weights``.

:data:`RLRolloutRayActor` is the Ray actor class; :class:`RLActorClass` is what the
launcher puts in place of ``RolloutRayActor``: its ``options(...).remote(...)`` builds
:data:`RLRolloutRayActor` with the settings read once in the driver.
"""
from __future__ import annotations

import asyncio
import contextvars
import copy
import hashlib
import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from vllm_rl.compat import vllm_version_shim

vllm_version_shim()

import ray  # noqa: E402
from openrlhf.trainer.ray import vllm_engine  # noqa: E402

from vllm_rl.integrations.openrlhf import (  # noqa: E402
    ENGINE_SETTINGS,
    SETTINGS_KWARG,
    check_settings,
    load_settings,
)
from vllm_rl.integrations.openrlhf.worker import WORKER_EXTENSION  # noqa: E402
from vllm_rl.integrations.common.partial import Part, end_step_async, merge  # noqa: E402
from vllm_rl.integrations.common.rpc import RLStateRPC  # noqa: E402
from vllm_rl.integrations.openrlhf import FLAGS_KEY, HIDDEN_KEY, RECORD_KEY  # noqa: E402
from vllm_rl.outcome import Reason, hidden_ids, record_of, with_hidden  # noqa: E402

OPENRLHF_WORKER = "openrlhf.trainer.ray.vllm_worker_wrap.WorkerWrap"
ORIGINAL = vllm_engine.RolloutRayActor                 # OpenRLHF's Ray actor class
_BASE = ORIGINAL.__ray_actor_class__                   # ... and the plain class under it


@dataclass
class _SampleState:
    """One sample of a ``generate_responses`` call (lives in its asyncio task's context);
    a continuation's earlier part and seed (``continue_responses``)."""

    flags: dict | None
    sent: bool = False
    records: list = field(default_factory=list)
    prior: Part | None = None
    seed: int | None = None


def whole_sample(output, prior: Part):
    """A continuation's ``RequestOutput`` as the whole sample: its completion's tokens,
    logprobs and text after the earlier part's, its record joined to the earlier one
    (:func:`~vllm_rl.integrations.common.partial.merge`)."""
    from vllm.logprobs import Logprob

    c = copy.copy(output.outputs[0])
    new = list(c.token_ids)
    lps = ([lp[t].logprob for lp, t in zip(c.logprobs, new)] if c.logprobs
           else [0.0] * len(new))
    info = record_of(c)
    if info is not None:
        c.rollout_info = merge(prior, new, lps, info).info
    if c.logprobs is not None:
        c.logprobs = [{t: Logprob(lp)} for t, lp in zip(prior.token_ids, prior.logprobs)] \
            + list(c.logprobs)
    c.token_ids = prior.token_ids + new
    c.text = (prior.text or "") + (c.text or "")
    out = copy.copy(output)
    out.outputs = [c, *output.outputs[1:]]
    return out


_SAMPLE: contextvars.ContextVar[_SampleState | None] = contextvars.ContextVar(
    "vllm_rl_openrlhf_sample", default=None)


def problem_id(prompt: Any) -> str:
    """A DAS problem id stable across steps: the prompt text's hash."""
    text = prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True, default=str)
    return "prompt:" + hashlib.sha1(text.encode()).hexdigest()[:16]


def engine_kwargs(kwargs: dict[str, Any], settings: dict[str, Any]) -> dict[str, Any]:
    """OpenRLHF's actor keywords turned into the RL engine's (see the module docstring)."""
    from vllm_rl.settings import EngineSettings, on_cpu

    kwargs = dict(kwargs)
    rl = EngineSettings.of(**{k: settings.get(k) for k in ENGINE_SETTINGS}).engine_kwargs()
    rl.pop("worker_extension_cls", None)
    if kwargs.get("worker_extension_cls") not in (None, OPENRLHF_WORKER, WORKER_EXTENSION):
        raise ValueError(f"worker_extension_cls={kwargs['worker_extension_cls']!r}: the RL "
                         f"actor runs {WORKER_EXTENSION} (OpenRLHF's WorkerWrap + vllm_rl's)")
    kwargs["worker_extension_cls"] = WORKER_EXTENSION
    for key, value in rl.items():
        if key == "additional_config":
            value = {**(kwargs.get(key) or {}), **value}
        elif kwargs.get(key) not in (None, value):
            raise ValueError(f"OpenRLHF's engine keyword {key}={kwargs[key]!r} conflicts with "
                             f"the RL engine's {key}={value!r}")
        kwargs[key] = value
    kwargs.update(settings.get("engine") or {})
    if on_cpu() and kwargs.get("gpu_memory_utilization") is None:
        from vllm_rl.llm import CPU_KV_CACHE_BYTES

        kwargs.pop("gpu_memory_utilization", None)
        kwargs.setdefault("kv_cache_memory_bytes", CPU_KV_CACHE_BYTES)
    return kwargs


class RLRolloutActor(RLStateRPC, _BASE):
    """OpenRLHF's ``RolloutRayActor`` on the RL engine (the module docstring)."""

    async def __init__(self, *args, **kwargs):
        settings = kwargs.pop(SETTINGS_KWARG, None)
        settings = load_settings() if settings is None else check_settings(settings)
        self.rl_settings = settings
        if settings.get("arrol"):
            from vllm_rl.arrol.config import use_v1_runner

            use_v1_runner()             # this actor owns one engine: process-wide is scoped
        from vllm_rl.integrations.common.policy import load_policy

        self.rl_policy = load_policy(settings)
        passthrough = {k: kwargs.pop(k) for k in ("num_gpus", "full_determinism",
                                                    "bundle_indices", "agent_func_path",
                                                    "remote_rm_url", "mm_pad_token_ids")
                       if k in kwargs}
        await super().__init__(*args, **passthrough, **engine_kwargs(kwargs, settings))

    # -- generation ------------------------------------------------------------------
    def rl_flags(self, prompt: Any, num_samples: int) -> dict | None:
        """The flags for the samples of one prompt (one group), or None (stock vLLM)."""
        from vllm_rl.integrations.common.policy import Sample

        sample = Sample(uid=f"openrlhf-{uuid.uuid4().hex}", n=int(num_samples),
                        problem_id=problem_id(prompt))
        return self.rl_policy.flags(sample)

    async def generate(self, prompt_token_ids, sampling_params, multi_modal_data=None):
        state = _SAMPLE.get()
        prior = None
        if state is not None and state.flags is not None and not state.sent:
            sampling_params = copy.deepcopy(sampling_params)
            extra = dict(sampling_params.extra_args or {})
            extra["vllm_rl"] = copy.deepcopy(state.flags)
            sampling_params.extra_args = extra
            state.sent = True
            prior = state.prior
            if prior is not None:        # a continuation: the prompt and its tokens so far
                prompt_token_ids = list(prompt_token_ids) + prior.token_ids
                sampling_params.max_tokens = max(
                    1, sampling_params.max_tokens - len(prior.token_ids))
                if state.seed is not None:
                    sampling_params.seed = state.seed
        output = await super().generate(prompt_token_ids, sampling_params, multi_modal_data)
        if state is not None and output is not None and output.outputs:
            if prior is not None:
                output = whole_sample(output, prior)
            state.records.append(record_of(output.outputs[0]))
        return output

    async def generate_responses(self, prompt, label, sampling_params, max_length: int,
                                 hf_tokenizer, num_samples: int = 1, images=None,
                                 vllm_rl_partial: dict | None = None):
        """OpenRLHF's: ``num_samples`` samples of one prompt, now one group, each response
        with its record, flags and training marks (:func:`.records.attach`).
        ``vllm_rl_partial``: the step's ``partial`` flags (partial rollouts, :mod:`.partial`):
        a group with a carried sample comes back with records and flags but no marks (the
        generator marks it once it is complete)."""
        from vllm_rl.integrations.openrlhf.records import attach

        flags = self.rl_flags(prompt, num_samples)
        if flags is not None and vllm_rl_partial:
            flags["partial"] = dict(vllm_rl_partial)

        results = await self._run_samples(
            [_SampleState(flags=flags) for _ in range(num_samples)], prompt=prompt,
            label=label, sampling_params=sampling_params, max_length=max_length,
            hf_tokenizer=hf_tokenizer, images=images)
        responses = [r for r, _ in results]
        if flags is None:
            return responses
        infos = [info for _, info in results]
        ids = hidden_ids(infos)
        if ids:                         # return_hidden: the vectors stayed on the workers
            infos = with_hidden(infos, await self.arrol_hidden(ids))
        if any(i is not None and i.reason is Reason.CARRIED for i in infos):
            return _with_records(responses, infos, flags)
        return attach(responses, infos, flags)

    async def continue_responses(self, prompt, label, sampling_params, max_length: int,
                                 hf_tokenizer, members: list[dict], images=None):
        """Partial rollouts: a carried group's carried samples, each continued as
        OpenRLHF's executor runs a sample (``members``: each one's earlier part, as
        ``Part.to_json``, its continuation flags and seed); each response is the whole
        sample, with its record and flags and no marks (the generator holds the group's
        other members)."""
        states = [_SampleState(flags=m["flags"], prior=Part.from_json(m["part"]),
                               seed=m.get("seed")) for m in members]
        results = await self._run_samples(
            states, prompt=prompt, label=label, sampling_params=sampling_params,
            max_length=max_length, hf_tokenizer=hf_tokenizer, images=images)
        return [_with_records([r], [info], m["flags"])[0]
                for (r, info), m in zip(results, members)]

    async def _run_samples(self, states: list[_SampleState], **execute) -> list[tuple]:
        """One OpenRLHF executor run per state, each in its own task (the state lives in
        that task's context: :meth:`generate` reads it); ``(response, record)`` each."""
        async def one(state):
            _SAMPLE.set(state)          # this task's context only
            response = await self.executor.execute(llm_engine=self, **execute)
            return response, (state.records[0] if state.records else None)

        return await asyncio.gather(*(asyncio.ensure_future(one(s)) for s in states))

    async def end_step(self, step: int) -> int:
        """End trainer step ``step`` on this engine (partial rollouts: the generator
        counted enough complete groups); how many samples it carries."""
        return await end_step_async(self.llm, step)

    # -- weight syncs -----------------------------------------------------------------
    async def update_weight(self, name, dtype, shape, empty_cache=False):
        out = await super().update_weight(name, dtype, shape, empty_cache)
        if empty_cache:                 # OpenRLHF's mark of the last parameter of a sync
            await self._weights_synced()
        return out

    async def update_weight_cuda_ipc(self, name, dtype, shape, ipc_handles, empty_cache=False):
        out = await super().update_weight_cuda_ipc(name, dtype, shape, ipc_handles, empty_cache)
        if empty_cache:
            await self._weights_synced()
        return out

    async def _weights_synced(self) -> dict:
        """After the sync's last load: no request reads KV of the old weights."""
        from vllm_rl.weights import weight_sync_async

        self.rl_last_sync = await weight_sync_async(self.llm)
        return self.rl_last_sync

    # -- RL state on the workers -----------------------------------------------------
    async def rl_rpc(self, method: str, args: tuple = ()) -> Any:
        """Call a :class:`vllm_rl.worker.RLWorkerExtension` method; rank 0's answer."""
        return (await self.llm.collective_rpc(method, args=tuple(args)))[0]

    def rl_vllm_config(self) -> Any:
        """The running engine's config (ARRoL updates checked against its head)."""
        return getattr(getattr(self, "llm", None), "vllm_config", None)

    async def flush_weights(self) -> int:
        """Load weights received but not yet loaded (normally done at the last one)."""
        return await self.rl_rpc("vllm_rl_flush_weights")


def _with_records(responses: list[dict], infos: list, flags: dict | None) -> list[dict]:
    """Each response with its record and flags, unmarked (its group is not complete)."""
    wire = json.dumps({k: v for k, v in (flags or {}).items() if k != "partial"},
                      sort_keys=True) if flags is not None else None
    for response, info in zip(responses, infos):
        response[RECORD_KEY] = info.encode() if info is not None else None
        response[FLAGS_KEY] = wire
        response[HIDDEN_KEY] = info.hidden_state() if info is not None else None
    return responses


RLRolloutRayActor = ray.remote(RLRolloutActor)


class _Options:
    def __init__(self, handle, settings: dict) -> None:
        self._handle, self._settings = handle, settings

    def remote(self, *args, **kwargs):
        kwargs.setdefault(SETTINGS_KWARG, self._settings)
        return self._handle.remote(*args, **kwargs)


class RLActorClass:
    """Put in place of OpenRLHF's ``RolloutRayActor``: ``options(...)`` and ``remote(...)``
    build :data:`RLRolloutRayActor` with ``settings`` (read once, in the driver)."""

    def __init__(self, settings: dict, actor_cls=None) -> None:
        self.settings = settings
        self.actor_cls = RLRolloutRayActor if actor_cls is None else actor_cls

    def options(self, **options) -> _Options:
        return _Options(self.actor_cls.options(**options), self.settings)

    def remote(self, *args, **kwargs):
        return _Options(self.actor_cls, self.settings).remote(*args, **kwargs)
