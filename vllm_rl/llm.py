"""The three ways to get the RL engine: offline :class:`LLM`, :func:`engine_args`, :func:`server_args`.

All three take the same settings (``das=``, ``arrol=``, ``cost=``, ``trace=``) and derive
vLLM's arguments from one :class:`~vllm_rl.settings.EngineSettings`: the RL scheduler, the
DAS drafter (vLLM's ``custom_class`` speculative method), ARRoL's head, the worker
extension.  The model is the caller's, as with ``vllm.LLM`` (the embedded demo model is
:data:`vllm_rl.task.MODEL_PATH`).  Everything else is vLLM's own, with vLLM's defaults.
:class:`LLM`'s RPC methods (``das_*``, ``arrol_*``) are the ones described in the one
table of :mod:`vllm_rl.rpc`, checked by it before ``collective_rpc``.
"""
from __future__ import annotations

import logging
import os
from typing import Any, Callable, Mapping, Sequence

import vllm
from vllm import SamplingParams

from vllm_rl.flags import read_or_warn
from vllm_rl.darts.rule import annotate_group
from vllm_rl.outcome import RolloutInfo, hidden_ids, with_hidden
from vllm_rl.rpc import BY_NAME, rpc_methods

logger = logging.getLogger(__name__)

CPU_KV_CACHE_BYTES = 1 << 30   # vLLM's CPU default reserves most of a NUMA node


def _defaults(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The engine keywords of an RL engine: the settings' (:class:`~vllm_rl.settings.
    EngineSettings`) and a bounded KV cache on the CPU; ``model`` is the caller's."""
    from vllm.platforms import current_platform

    from vllm_rl.settings import EngineSettings

    if isinstance(kwargs.get("model"), os.PathLike):
        kwargs["model"] = os.fspath(kwargs["model"])
    settings = EngineSettings.of(**{k: kwargs.pop(k, None) for k in ("das", "arrol", "cost")},
                                 trace=kwargs.pop("trace", False))
    kwargs = settings.engine_kwargs(kwargs)
    if current_platform.is_cpu() and "gpu_memory_utilization" not in kwargs:
        kwargs.setdefault("kv_cache_memory_bytes", CPU_KV_CACHE_BYTES)
    return kwargs


@rpc_methods()
class LLM(vllm.LLM):
    """``vllm.LLM`` on the RL engine.  Same signature: ``model`` (a local path or a Hugging
    Face id; a ``Path`` works too) is required, as in ``vllm.LLM``.

    Extra keywords: ``das=`` (the DAS drafter, see :class:`~vllm_rl.das.config.DASConfig`),
    ``cost=`` (the step-cost model the engine plans with: ``"online"``, the default, or a
    table such as ``"h100:qwen3-8b"``; see :func:`vllm_rl.cost.load_cost`) and
    ``trace=True`` (record every engine step, :mod:`vllm_rl.engine.trace`) and
    ``arrol=`` (ARRoL's quality head, see :class:`~vllm_rl.arrol.config.ArrolConfig`;
    it selects vLLM's V1 model runner for this process, ``VLLM_USE_V2_MODEL_RUNNER=0``).

    :meth:`generate` returns vLLM's ``RequestOutput`` objects whose completions carry a
    ``rollout_info`` (:class:`~vllm_rl.outcome.RolloutInfo`), with each group's
    training-group marks filled in.
    """

    def __init__(self, model: str | os.PathLike, **kwargs: Any) -> None:
        kwargs["model"] = model
        if not kwargs.get("arrol"):
            super().__init__(**_defaults(kwargs))
            return
        from vllm_rl.arrol.config import v1_runner_env

        with v1_runner_env():       # the engine (and its processes) start on the V1 runner
            super().__init__(**_defaults(kwargs))

    def generate(self, prompts, sampling_params=None, **kwargs):
        """``vllm.LLM.generate``, each completion with its ``rollout_info``: each group's
        training-group marks filled in, and the hidden states the records name
        (``arrol.return_hidden``: ``RolloutInfo.hidden_state()``) taken from the workers
        in one :meth:`arrol_hidden` call."""
        outputs = super().generate(prompts, sampling_params, **kwargs)
        n_prompts = len(outputs)
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            params = [sampling_params] * n_prompts
        else:
            params = list(sampling_params)
        attach_rollout_info(outputs, params, fetch_hidden=self.arrol_hidden)
        return outputs

    # -- weights (an RL step's new policy) ---------------------------------------
    def load_weights(self, weights) -> None:
        """New weights in place, RL state kept (:func:`vllm_rl.weights.load_weights`)."""
        from vllm_rl.weights import load_weights

        load_weights(self, weights)

    # -- the RL state on the workers (the RPC table, vllm_rl.rpc.METHODS) ----------
    def _rl_call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """``collective_rpc`` of one table method (the ``das_*`` / ``arrol_*`` methods,
        generated from :data:`vllm_rl.rpc.METHODS`), its arguments checked (and against
        this engine's config) before any worker sees them; rank 0's result."""
        m = BY_NAME[method]
        config = getattr(getattr(self, "llm_engine", None), "vllm_config", None)
        args = m.engine_call_args(config, *args, **kwargs)
        return m.result(self.collective_rpc(m.name, args=args))


def attach_rollout_info(outputs: Sequence[Any], params: Sequence[SamplingParams | None],
                        fetch_hidden: Callable[[list[str]], Mapping[str, Any]] | None = None
                        ) -> None:
    """Give every completion a ``rollout_info`` and mark each group's training group.

    ``fetch_hidden`` (``LLM.arrol_hidden``): the records that name a hidden state kept on
    the workers (``hidden_id``) get it, all of them in one call; without it they keep
    only the id."""
    groups: dict[str, tuple[Any, list[Any]]] = {}
    for out, sp in zip(outputs, params):
        flags, read_yet = None, False
        for c in out.outputs:
            c.rollout_info = RolloutInfo.from_completion(c)
            gid = c.rollout_info.group_id
            if gid is None or sp is None or not sp.extra_args:
                continue
            if not read_yet:         # once per request; the engine accepted these flags
                flags, read_yet = read_or_warn(sp.extra_args, str(out.request_id), logger,
                                               n=sp.n, default_group_id=gid), True
            if flags is not None:
                groups.setdefault(gid, (flags, []))[1].append(c)
    for flags, completions in groups.values():
        if flags.darts is None:
            continue
        infos = annotate_group([c.rollout_info for c in completions], flags.group.size,
                               flags.darts.k, flags.darts.early_stop(flags.group))
        for c, info in zip(completions, infos):
            c.rollout_info = info
    if fetch_hidden is not None:
        completions = [c for out in outputs for c in out.outputs]
        ids = hidden_ids([c.rollout_info for c in completions])
        if ids:
            infos = with_hidden([c.rollout_info for c in completions], fetch_hidden(ids))
            for c, info in zip(completions, infos):
                c.rollout_info = info


def engine_args(model: str | os.PathLike, **kwargs: Any):
    """``AsyncEngineArgs`` for an ``AsyncLLM`` server on the RL engine, on ``model`` (a
    path or a Hugging Face id).  With ``arrol=`` the V1 model runner is selected for the
    whole process (the engine starts later)."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    kwargs["model"] = model
    if kwargs.get("arrol"):
        from vllm_rl.arrol.config import use_v1_runner

        use_v1_runner()
    return AsyncEngineArgs(**_defaults(kwargs))


def server_args(das: Any = None, arrol: Any = None, cost: Any = None,
                trace: bool = False) -> list[str]:
    """The ``vllm serve`` flags that select the RL engine (``das=``: with the DAS drafter;
    ``arrol=``: with ARRoL's quality head).  The server's environment needs
    :meth:`~vllm_rl.settings.EngineSettings.env` too (``VLLM_RL_ENGINE=1``, which asks for
    vllm_rl's patches, and with ARRoL ``VLLM_USE_V2_MODEL_RUNNER=0``): ``vllm-rl serve``
    sets both."""
    from vllm_rl.settings import EngineSettings

    return EngineSettings.of(das=das, arrol=arrol, cost=cost, trace=trace).cli_args()
