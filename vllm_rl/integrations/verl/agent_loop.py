"""verl's single-turn agent loop with vllm_rl flags on every sample (``vllm_rl_agent``).

Set ``actor_rollout_ref.rollout.agent.default_agent_loop=vllm_rl_agent``.  Each sample
asks the policy (:mod:`.policy`, built once per worker process from
``rollout.engine_kwargs.vllm_rl``) for its flags, sends them in
``sampling_params["extra_args"]["vllm_rl"]`` (verl passes ``extra_args`` to vLLM's
``SamplingParams`` unchanged; the router reads them too), and returns the flags it ran
with in ``extra_fields["vllm_rl_flags"]`` beside the record the server put in
``extra_fields["vllm_rl"]``: the trainer side (:mod:`.loss`) needs both.
"""
from __future__ import annotations

import json
from typing import Any

from vllm_rl.compat import vllm_version_shim

vllm_version_shim()

from verl.experimental.agent_loop.agent_loop import AgentLoopOutput  # noqa: E402
from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop  # noqa: E402

from vllm_rl.integrations.verl import FLAGS_KEY  # noqa: E402
from vllm_rl.integrations.common.policy import RolloutPolicy, Sample, load_policy  # noqa: E402
from vllm_rl.integrations.verl.server import engine_settings  # noqa: E402

_policies: dict[str, RolloutPolicy] = {}


def policy_for(rollout_config) -> RolloutPolicy:
    """The worker's policy for these settings (built once per process and settings)."""
    settings = engine_settings(rollout_config)
    key = json.dumps(settings, sort_keys=True, default=str)
    if key not in _policies:
        _policies[key] = load_policy(settings)
    return _policies[key]


class RLAgentLoop(SingleTurnAgentLoop):
    """``SingleTurnAgentLoop`` whose requests carry each sample's vllm_rl flags."""

    async def run(self, sampling_params: dict[str, Any], **kwargs) -> AgentLoopOutput:
        sample = Sample.of(kwargs, self.rollout_config.n)
        flags = policy_for(self.rollout_config).flags(sample)
        if flags is not None:
            sampling_params = dict(sampling_params)
            extra = dict(sampling_params.get("extra_args") or {})
            extra["vllm_rl"] = flags
            sampling_params["extra_args"] = extra
        output = await super().run(sampling_params, **kwargs)
        if flags is not None:
            output.extra_fields[FLAGS_KEY] = json.dumps(flags, sort_keys=True)
        return output
