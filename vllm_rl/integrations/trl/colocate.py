"""TRL's colocated vLLM (``GRPOConfig(use_vllm=True, vllm_mode="colocate")``) on the RL engine.

TRL builds ``vllm.LLM`` inside ``trl.generation.vllm_generation`` with fixed keywords and
no passthrough; :func:`use_vllm_rl` replaces that module's ``LLM`` with a factory of
:class:`ColocateLLM`, a :class:`vllm_rl.LLM` whose requests carry the given flags.  TRL
sends each prompt ``num_generations`` times in a row with ``n = 1``: consecutive identical
prompts are one group (``group.id`` per call and prompt, ``size`` = ``redundant`` = the
run length), which DARTS needs; DUET, DAS and ARRoL need no group.  TRL reloads weights
with ``model.load_weights`` on the in-process runner, one parameter at a time; vLLM 0.32
refuses that after the first load, so :class:`ColocateLLM` collects them and loads them
at once with vLLM's ``reload_weights`` when TRL resets the prefix cache right after (the
RL state stays).  TRL keeps only token ids and log-probs from the outputs; the records of the last
call are on ``ColocateLLM.last_infos``.  For the records in the loss, use
:class:`~vllm_rl.integrations.trl.rollout.RolloutFunc` instead.
"""
from __future__ import annotations

import copy
import functools
from typing import Any

from vllm import SamplingParams

from vllm_rl.compat import vllm_version_shim
from vllm_rl.llm import LLM

vllm_version_shim()          # TRL asks importlib for the "vllm" distribution


def _key(prompt: Any) -> Any:
    if isinstance(prompt, dict):
        return tuple(prompt.get("prompt_token_ids") or ()) or prompt.get("prompt")
    return tuple(prompt) if isinstance(prompt, list) else prompt


class ColocateLLM(LLM):
    """:class:`vllm_rl.LLM` that puts ``rl_flags`` (and group ids) on every request."""

    def __init__(self, *args: Any, rl_flags: dict | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.rl_flags = copy.deepcopy(rl_flags) if rl_flags else None
        self.calls = 0
        self.last_infos: list = []
        self._pending: list = []
        self._model = self._runner_model()
        if self._model is not None:
            self._model.load_weights = self._pending.extend

    def _runner_model(self):
        executor = getattr(self.llm_engine, "model_executor", None)
        runner = getattr(getattr(executor, "driver_worker", None), "model_runner", None)
        return getattr(runner, "model", None)

    def reset_prefix_cache(self, *args: Any, **kwargs: Any):
        """TRL's colocated weight sync calls the runner model's ``load_weights`` once per
        parameter, then this.  On vLLM 0.32 a direct ``load_weights`` after the first
        load fails (the loaded layers have dropped their ``weight_loader``); the calls
        are collected and loaded here at once through vLLM's ``reload_weights``."""
        if self._pending:
            from vllm_rl.weights import _pairs, engine_dtype

            pending = _pairs(self._pending, engine_dtype(self))
            self._pending.clear()
            del self._model.load_weights           # vLLM's own, for the reload
            try:
                self.collective_rpc("reload_weights", kwargs={"weights_iterator": pending})
            finally:
                self._model.load_weights = self._pending.extend
        return super().reset_prefix_cache(*args, **kwargs)

    def generate(self, prompts, sampling_params=None, **kwargs):
        if self.rl_flags is not None and isinstance(sampling_params, SamplingParams):
            prompts = list(prompts)
            sampling_params = self._with_flags(prompts, sampling_params)
        outputs = super().generate(prompts, sampling_params, **kwargs)
        self.calls += 1
        self.last_infos = [c.rollout_info for o in outputs for c in o.outputs]
        return outputs

    def _with_flags(self, prompts: list, base: SamplingParams) -> list[SamplingParams]:
        from vllm_rl import rl_params

        runs: list[int] = []
        for i, p in enumerate(prompts):
            if i and _key(p) == _key(prompts[i - 1]):
                runs[-1] += 1
            else:
                runs.append(1)
        params = []
        for k, length in enumerate(runs):
            flags = copy.deepcopy(self.rl_flags)
            if "darts" in flags or "group" in flags:
                group = flags.setdefault("group", {})
                group.update(id=f"trl-{self.calls}-{k}", redundant=length)
                group["size"] = min(group.get("size", length), length)
            sp = base.clone()
            sp.extra_args = {**(sp.extra_args or {}), **rl_params(**flags)}
            params += [sp] * length
        return params


def use_vllm_rl(rl_flags: dict | None = None, **engine_kwargs: Any) -> None:
    """Make TRL's colocated mode build :class:`ColocateLLM` (``engine_kwargs`` such as
    ``das=True`` or ``arrol=True`` go to the engine, over TRL's own keywords)."""
    import trl.generation.vllm_generation as generation

    def factory(**trl_kwargs: Any) -> ColocateLLM:
        kwargs = {**trl_kwargs, **engine_kwargs}
        from vllm.platforms import current_platform

        if current_platform.is_cpu():     # TRL's GPU memory share means nothing on a CPU
            kwargs.pop("gpu_memory_utilization", None)
        return ColocateLLM(rl_flags=rl_flags, **kwargs)

    generation.LLM = functools.wraps(ColocateLLM)(factory)
