"""verl's single-turn agent loop with vllm_rl flags on every sample (``vllm_rl_agent``).

Set ``actor_rollout_ref.rollout.agent.default_agent_loop=vllm_rl_agent``.  Each sample
asks the policy (:mod:`.policy`, built once per worker process from
``rollout.engine_kwargs.vllm_rl``) for its flags, sends them in
``sampling_params["extra_args"]["vllm_rl"]`` (verl passes ``extra_args`` to vLLM's
``SamplingParams`` unchanged; the router reads them too), and returns the flags it ran
with in ``extra_fields["vllm_rl_flags"]`` beside the record the server put in
``extra_fields["vllm_rl"]``: the trainer side (:mod:`.loss`) needs both.

With partial rollouts (:mod:`.partial`) a new prompt's row adds the step's ``partial``
flags to each sample's, and a carried group's row is answered member by member: one
that ended in an earlier step comes back as it was (no request), a carried one goes on
as a continuation, its output the whole sample (the earlier tokens and logprobs, then
the new ones, under the engine's record of the whole sample).
"""
from __future__ import annotations

import json
from typing import Any
from uuid import uuid4

from vllm_rl.compat import vllm_version_shim

vllm_version_shim()

from verl.experimental.agent_loop.agent_loop import (  # noqa: E402
    AgentLoopMetrics,
    AgentLoopOutput,
)
from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop  # noqa: E402

from vllm_rl.integrations.common.partial import Part, merge  # noqa: E402
from vllm_rl.integrations.common.policy import RolloutPolicy, Sample, load_policy  # noqa: E402
from vllm_rl.integrations.verl.keys import FLAGS_KEY, RECORD_KEY  # noqa: E402
from vllm_rl.integrations.verl.partial import CARRY_KEY, RULE_KEY, CarryPayload  # noqa: E402
from vllm_rl.integrations.verl.server import engine_settings  # noqa: E402
from vllm_rl.outcome import RolloutInfo  # noqa: E402

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
        carry = CarryPayload.of(kwargs.pop(CARRY_KEY, None))
        rule = kwargs.pop(RULE_KEY, None)
        if carry is not None:
            return await self._carried(carry, carry.members[int(kwargs["session_id"])],
                                       sampling_params)
        sample = Sample.of(kwargs, self.rollout_config.n)
        flags = policy_for(self.rollout_config).flags(sample)
        if flags is not None and rule:
            flags["partial"] = json.loads(rule)
        if flags is not None:
            sampling_params = dict(sampling_params)
            extra = dict(sampling_params.get("extra_args") or {})
            extra["vllm_rl"] = flags
            sampling_params["extra_args"] = extra
        output = await super().run(sampling_params, **kwargs)
        if flags is not None:
            output.extra_fields[FLAGS_KEY] = json.dumps(flags, sort_keys=True)
        return output

    async def _carried(self, carry: CarryPayload, member: dict,
                       sampling_params: dict[str, Any]) -> AgentLoopOutput:
        """A carried group's member: as it ended in an earlier step, or continued now."""
        part = Part.from_json(member["part"])
        if "prompt_ids" in member:
            params = dict(sampling_params, max_tokens=member["max_tokens"],
                          extra_args={**(sampling_params.get("extra_args") or {}),
                                      "vllm_rl": member["flags"]})
            if member.get("seed") is not None:
                params["seed"] = member["seed"]
            out = await self.server_manager.generate(
                request_id=uuid4().hex, prompt_ids=member["prompt_ids"], sampling_params=params)
            info = RolloutInfo.decode(out.extra_fields.get(RECORD_KEY))
            logprobs = list(out.log_probs) if out.log_probs else [0.0] * len(out.token_ids)
            part = merge(part, out.token_ids, logprobs, info or part.info)
        n = min(len(part.token_ids), self.response_length)
        return AgentLoopOutput(
            prompt_ids=carry.prompt_ids, response_ids=part.token_ids[:n],
            response_mask=[1] * n, response_logprobs=part.logprobs[:n], num_turns=2,
            metrics=AgentLoopMetrics(),
            extra_fields={RECORD_KEY: part.info.encode(),
                          FLAGS_KEY: json.dumps(carry.flags, sort_keys=True),
                          "turn_scores": [], "tool_rewards": []})
