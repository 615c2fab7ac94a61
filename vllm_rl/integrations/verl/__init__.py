"""vllm_rl as a verl rollout backend: ``actor_rollout_ref.rollout.name=vllm_rl``.

Installing vllm_rl adds the entry point ``verl.plugins: vllm_rl`` (module
:mod:`vllm_rl.integrations.verl.plugin`); verl loads it in every process that imports
verl, and :func:`register` puts four things into verl's registries:

==========================  ==========================================================
``vllm_rl`` replica          ``RolloutReplicaRegistry`` → :class:`.server.RLReplica`
                             (server actors ``vllm_rl_server_{replica}_{node}``)
``("vllm_rl", "async")``     ``_ROLLOUT_REGISTRY`` → verl's vLLM ``ServerAdapter`` (the
                             trainer-side weight sync; it finds our actors by name)
``vllm_rl_agent``            the agent loop that attaches each sample's flags
                             (:class:`.agent_loop.RLAgentLoop`), registered when verl's
                             agent-loop module is imported
``vllm_rl_sync``             the trainer mode that turns records into the loss
                             (:class:`.trainer.RLTrainerSync`), registered when verl's
                             v1 trainer module is imported
==========================  ==========================================================

verl logs a plugin that fails to import only at DEBUG level.  This plugin says why at
WARNING level, and :func:`check_registered` (run by the replica, the agent loop and
``python -m vllm_rl.integrations.verl``) raises with the missing pieces named.
"""
from __future__ import annotations

import importlib.metadata
import sys
from pathlib import Path

from vllm_rl.integrations.common.hooks import after_import

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


def _register_agent_loop(module) -> None:
    module._agent_loop_registry.setdefault(AGENT_LOOP, {"_target_": AGENT_LOOP_CLS})


def _register_trainer(module) -> None:
    from vllm_rl.integrations.verl import trainer  # noqa: F401  (@register_trainer)


def _load_replica():
    from vllm_rl.integrations.verl.server import RLReplica

    return RLReplica


_registered = False


def register() -> None:
    """Put vllm_rl into verl's registries (idempotent; the ``verl.plugins`` entry point)."""
    global _registered
    if _registered:
        return
    from vllm_rl.compat import vllm_version_shim

    vllm_version_shim()                 # verl's vLLM rollout asks for the "vllm" distribution
    check_version()
    from verl.workers.rollout import base
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    RolloutReplicaRegistry.register(NAME, _load_replica)
    base._ROLLOUT_REGISTRY[(NAME, "async")] = ADAPTER_CLS
    after_import(AGENT_LOOP_MODULE, _register_agent_loop)
    after_import(TRAINER_MODULE, _register_trainer)
    _registered = True


def registration_problems() -> list[str]:
    """What is missing from verl's registries in this process (empty: all registered)."""
    from verl.workers.rollout import base
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    problems = []
    if NAME not in RolloutReplicaRegistry._registry:
        problems.append(f"rollout replica {NAME!r} (RolloutReplicaRegistry)")
    if base._ROLLOUT_REGISTRY.get((NAME, "async")) != ADAPTER_CLS:
        problems.append(f"rollout adapter ({NAME!r}, 'async') (_ROLLOUT_REGISTRY)")
    agent = sys.modules.get(AGENT_LOOP_MODULE)
    if agent is not None and AGENT_LOOP not in agent._agent_loop_registry:
        problems.append(f"agent loop {AGENT_LOOP!r}")
    trainer = sys.modules.get(TRAINER_MODULE)
    if trainer is not None and TRAINER_MODE not in trainer.TRAINER_REGISTRY:
        problems.append(f"trainer mode {TRAINER_MODE!r}")
    return problems


def check_registered() -> None:
    """Raise, naming what is missing, unless vllm_rl is registered with verl here."""
    import verl  # noqa: F401  (runs verl's plugin discovery, which calls register())

    problems = registration_problems()
    if problems:
        raise RuntimeError(
            "vllm_rl is not registered with verl in this process; missing: "
            + "; ".join(problems) + ". Is vllm_rl installed in this environment (entry point "
            "'verl.plugins: vllm_rl'), and not excluded by VERL_USE_EXTERNAL_PLUGINS? "
            "Its import error, if any, is logged at WARNING by 'vllm_rl.integrations.verl'.")
