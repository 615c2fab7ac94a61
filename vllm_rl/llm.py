"""The three ways to get the RL engine: offline :class:`LLM`, :func:`engine_args`, :func:`server_args`.

All three set ``scheduler_cls`` to :class:`~vllm_rl.engine.scheduler.RLScheduler` with
async scheduling on (on vLLM's CPU platform, which schedules every engine synchronously,
:class:`~vllm_rl.engine.scheduler.RLSyncScheduler`), and default the model to the
embedded one.  ``das=True`` (or a
dict / :class:`~vllm_rl.spec.config.DASConfig`) starts the DAS drafter instead: vLLM's
``custom_class`` speculative method with :class:`~vllm_rl.spec.proposer.DASProposer`,
synchronous scheduling (:class:`~vllm_rl.engine.scheduler.RLSyncScheduler`) and the tree
API on the worker.  Everything else is vLLM's own, with vLLM's defaults.
"""
from __future__ import annotations

from typing import Any, Sequence

import vllm
from vllm import SamplingParams

from vllm_rl import SCHEDULER_CLS, SYNC_SCHEDULER_CLS, WORKER_EXTENSION_CLS
from vllm_rl.flags import extract, normalize, parse
from vllm_rl.outcome import RolloutInfo, annotate_group

CPU_KV_CACHE_BYTES = 1 << 30   # vLLM's CPU default reserves most of a NUMA node


TRACE_KEY = "vllm_rl_trace"    # additional_config: record each engine step (engine/trace.py)
COST_KEY = "vllm_rl_cost"      # additional_config: the StepCost spec (vllm_rl.cost.load_cost)


def _defaults(kwargs: dict[str, Any]) -> dict[str, Any]:
    from vllm.platforms import current_platform

    from vllm_rl.task import MODEL_PATH

    kwargs = _rl_kwargs(kwargs)
    kwargs.setdefault("model", str(MODEL_PATH))
    if current_platform.is_cpu() and "gpu_memory_utilization" not in kwargs:
        kwargs.setdefault("kv_cache_memory_bytes", CPU_KV_CACHE_BYTES)
    return kwargs


def rl_engine_kwargs(das: Any = None, arrol: Any = None, cost: Any = None,
                     trace: bool = False) -> dict[str, Any]:
    """The vLLM engine keywords that make an engine the RL engine (scheduler, DAS drafter,
    ARRoL head, cost model, step trace), for a framework that builds its own engine
    arguments (verl's server).  ``worker_extension_cls`` is
    :data:`vllm_rl.WORKER_EXTENSION_CLS` where DAS or ARRoL need it: a framework with its
    own extension combines the two classes.  With ``arrol`` the process must select the
    V1 model runner before the engine starts (:func:`vllm_rl.arrol.config.use_v1_runner`)."""
    return _rl_kwargs({"das": das, "arrol": arrol, "cost": cost, "trace": trace})


def _rl_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    extra = {}
    if kwargs.pop("trace", False):          # record every engine step (engine.trace)
        extra[TRACE_KEY] = True
    cost = kwargs.pop("cost", None)         # the step-cost model the engine plans with
    if cost is not None:
        from vllm_rl.cost import load_cost

        load_cost(cost)                     # a bad spec fails here, not in the worker
        extra[COST_KEY] = cost
    if extra:
        kwargs["additional_config"] = {**(kwargs.get("additional_config") or {}), **extra}
    das = kwargs.pop("das", None)
    if das:
        from vllm_rl.spec.config import DASConfig

        for key, value in DASConfig.of(das).engine_kwargs().items():
            if key == "additional_config":
                value = {**(kwargs.get(key) or {}), **value}
            elif key in kwargs and kwargs[key] != value:
                raise ValueError(f"das= sets {key}={value!r}; got {kwargs[key]!r}")
            kwargs[key] = value
        kwargs.setdefault("worker_extension_cls", WORKER_EXTENSION_CLS)
    arrol = kwargs.pop("arrol", None)
    if arrol:            # the caller selects the V1 runner (LLM: scoped; engine_args: process)
        from vllm_rl.arrol.config import ArrolConfig

        cfg = ArrolConfig.of(arrol).engine_kwargs()
        kwargs["additional_config"] = {**(kwargs.get("additional_config") or {}),
                                       **cfg["additional_config"]}
        kwargs.setdefault("worker_extension_cls", cfg["worker_extension_cls"])
    sync = _cpu()        # vLLM's CPU platform turns async scheduling off for every engine
    kwargs.setdefault("worker_extension_cls", WORKER_EXTENSION_CLS)   # RL state + weights
    kwargs.setdefault("scheduler_cls", SYNC_SCHEDULER_CLS if sync else SCHEDULER_CLS)
    kwargs.setdefault("async_scheduling", not sync)
    return kwargs


def _cpu() -> bool:
    """On vLLM's CPU platform, which runs every engine with synchronous scheduling (stock
    vLLM there is the plain ``Scheduler``): the RL engine takes
    :class:`~vllm_rl.engine.scheduler.RLSyncScheduler` to match it, instead of the
    ``AsyncScheduler``-based one running with async scheduling off."""
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


class LLM(vllm.LLM):
    """``vllm.LLM`` on the RL engine.  Same signature; ``model`` defaults to the embedded one.

    Extra keywords: ``das=`` (the DAS drafter, see :class:`~vllm_rl.spec.config.DASConfig`),
    ``cost=`` (the step-cost model the engine plans with: ``"online"``, the default, or a
    table such as ``"h100:qwen3-8b"``; see :func:`vllm_rl.cost.load_cost`) and
    ``trace=True`` (record every engine step, :mod:`vllm_rl.engine.trace`) and
    ``arrol=`` (ARRoL's quality head, see :class:`~vllm_rl.arrol.config.ArrolConfig`;
    it selects vLLM's V1 model runner for this process, ``VLLM_USE_V2_MODEL_RUNNER=0``).

    :meth:`generate` returns vLLM's ``RequestOutput`` objects whose completions carry a
    ``rollout_info`` (:class:`~vllm_rl.outcome.RolloutInfo`), with each group's
    training-group marks filled in.
    """

    def __init__(self, model: str | None = None, **kwargs: Any) -> None:
        if model is not None:
            kwargs["model"] = model
        if not kwargs.get("arrol"):
            super().__init__(**_defaults(kwargs))
            return
        from vllm_rl.arrol.config import v1_runner_env

        with v1_runner_env():       # the engine (and its processes) start on the V1 runner
            super().__init__(**_defaults(kwargs))

    def generate(self, prompts, sampling_params=None, **kwargs):
        outputs = super().generate(prompts, sampling_params, **kwargs)
        n_prompts = len(outputs)
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            params = [sampling_params] * n_prompts
        else:
            params = list(sampling_params)
        attach_rollout_info(outputs, params)
        return outputs

    # -- weights (an RL step's new policy) ---------------------------------------
    def load_weights(self, weights) -> None:
        """New weights in place, RL state kept (:func:`vllm_rl.weights.load_weights`)."""
        from vllm_rl.weights import load_weights

        load_weights(self, weights)

    # -- DAS trees (engines started with das=...) --------------------------------
    def das_prebuild(self, problem_id: str, rollouts, prompt_token_ids=None) -> int:
        """Fill ``problem_id``'s tree with past rollouts (lists of output token ids)."""
        rollouts = [list(map(int, r)) for r in rollouts]
        prompt = list(map(int, prompt_token_ids)) if prompt_token_ids is not None else None
        return self.collective_rpc("das_prebuild", args=(problem_id, rollouts, prompt))[0]

    def das_clear(self, problem_id: str | None = None) -> int:
        """Drop one problem's tree, or all of them."""
        return self.collective_rpc("das_clear", args=(problem_id,))[0]

    # -- ARRoL head (engines started with arrol=...) ------------------------------
    def arrol_update(self, head: dict | str | None = None, calibration=None,
                     cold_start: bool = False, version: int | None = None) -> int:
        """Load the quality head's weights (``QualityHead.export``) and/or the
        calibration (``Calibration`` or its dict) between steps; ``cold_start=True``
        goes back to scoring without pruning.  Returns the head version that scores
        from the next step on (every record names its version)."""
        if calibration is not None and not isinstance(calibration, dict):
            calibration = calibration.to_dict()
        return self.collective_rpc("arrol_update",
                                   args=(head, calibration, cold_start, version))[0]

    def arrol_info(self) -> dict:
        """The head's version, shape and calibration, samples scored and pruned (rank 0)."""
        return self.collective_rpc("arrol_info")[0]

    def das_stats(self) -> dict:
        """Trees, memory, acceptance totals and per verification step (rank 0's drafter)."""
        return self.collective_rpc("das_stats")[0]


def attach_rollout_info(outputs: Sequence[Any], params: Sequence[SamplingParams | None]) -> None:
    """Give every completion a ``rollout_info`` and mark each group's training group."""
    groups: dict[str, tuple[Any, list[Any]]] = {}
    for out, sp in zip(outputs, params):
        raw = extract(sp.extra_args) if sp is not None else None
        for c in out.outputs:
            c.rollout_info = RolloutInfo.from_completion(c)
            gid = c.rollout_info.group_id
            if raw is not None and gid is not None:
                flags = parse(normalize(raw, n=sp.n, default_group_id=gid))
                groups.setdefault(gid, (flags, []))[1].append(c)
    for flags, completions in groups.values():
        if flags.darts is None:
            continue
        infos = annotate_group([c.rollout_info for c in completions], flags.group.size,
                               flags.darts.k, flags.darts.early_stop(flags.group))
        for c, info in zip(completions, infos):
            c.rollout_info = info


def engine_args(**kwargs: Any):
    """``AsyncEngineArgs`` for an ``AsyncLLM`` server on the RL engine.  With ``arrol=``
    the V1 model runner is selected for the whole process (the engine starts later)."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    if kwargs.get("arrol"):
        from vllm_rl.arrol.config import use_v1_runner

        use_v1_runner()
    return AsyncEngineArgs(**_defaults(kwargs))


def server_args(das: Any = None, arrol: Any = None) -> list[str]:
    """The ``vllm serve`` flags that select the RL engine (``das=``: with the DAS drafter;
    ``arrol=``: with ARRoL's quality head, which also needs ``VLLM_USE_V2_MODEL_RUNNER=0``
    in the server's environment: ``python -m vllm_rl.serve --arrol`` sets it)."""
    import json

    extra: dict[str, Any] = {}
    if arrol:
        from vllm_rl.arrol.config import ArrolConfig

        extra.update(ArrolConfig.of(arrol).engine_kwargs()["additional_config"])
    if not das and _cpu():
        args = ["--scheduler-cls", SYNC_SCHEDULER_CLS, "--no-async-scheduling"]
    elif not das:
        args = ["--scheduler-cls", SCHEDULER_CLS, "--async-scheduling"]
    else:
        from vllm_rl.spec.config import DASConfig

        kw = DASConfig.of(das).engine_kwargs()    # sync: vLLM allows no async scheduling
        extra.update(kw["additional_config"])      # with a custom_class drafter (see there)
        args = ["--scheduler-cls", kw["scheduler_cls"], "--no-async-scheduling",
                "--speculative-config", json.dumps(kw["speculative_config"])]
    if extra:
        args += ["--additional-config", json.dumps(extra), "--worker-extension-cls",
                 WORKER_EXTENSION_CLS]
    return args
