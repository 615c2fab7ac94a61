"""The names vllm_rl uses in verl's configuration and registries, and the verl versions the
integration was checked against (one place; the package, the server, the trainer, the
loss and the agent loop import them from here)."""
from __future__ import annotations

import importlib.metadata
from pathlib import Path

NAME = "vllm_rl"                       # actor_rollout_ref.rollout.name
AGENT_LOOP = "vllm_rl_agent"           # actor_rollout_ref.rollout.agent.default_agent_loop
TRAINER_MODE = "vllm_rl_sync"          # trainer.v1.trainer_mode
SETTINGS_KEY = "vllm_rl"               # actor_rollout_ref.rollout.engine_kwargs.vllm_rl
RECORD_KEY = "vllm_rl"                 # extra_fields: the sample's record (RolloutInfo wire)
FLAGS_KEY = "vllm_rl_flags"            # extra_fields: the flags the sample ran with (JSON)
CHECKED = ("0.9.1",)                   # verl versions this integration was checked against
ROUTER_CONFIG = Path(__file__).with_name("router.yaml")   # rollout.router_config_path

REPLICA_CLS = "vllm_rl.integrations.verl.server.RLReplica"
ADAPTER_CLS = "verl.workers.rollout.vllm_rollout.ServerAdapter"
AGENT_LOOP_CLS = "vllm_rl.integrations.verl.agent_loop.RLAgentLoop"
AGENT_LOOP_MODULE = "verl.experimental.agent_loop.agent_loop"
TRAINER_MODULE = "verl.trainer.ppo.v1.trainer_base"


def verl_version() -> str:
    return importlib.metadata.version("verl")


def check_version() -> None:
    """Raise unless the installed verl is one this integration was checked against."""
    found = verl_version()
    if found not in CHECKED:
        raise RuntimeError(f"vllm_rl's verl integration was checked against verl {CHECKED}; "
                           f"found verl {found}. Install verl=={CHECKED[-1]} "
                           f"(bash scripts/install.sh does) or check the integration anew.")
