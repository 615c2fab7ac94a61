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


from vllm_rl.integrations.common.hooks import after_import

from vllm_rl.integrations.verl.checks import check_registered, registration_problems
from vllm_rl.integrations.verl.keys import (ADAPTER_CLS, AGENT_LOOP, AGENT_LOOP_CLS,
                                            AGENT_LOOP_MODULE, CHECKED, FLAGS_KEY, NAME,
                                            RECORD_KEY, REPLICA_CLS, ROUTER_CONFIG,
                                            SETTINGS_KEY, TRAINER_MODE, TRAINER_MODULE,
                                            check_version, verl_version)


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


__all__ = ["ADAPTER_CLS", "AGENT_LOOP", "AGENT_LOOP_CLS", "AGENT_LOOP_MODULE", "CHECKED",
           "FLAGS_KEY", "NAME", "RECORD_KEY", "REPLICA_CLS", "ROUTER_CONFIG", "SETTINGS_KEY",
           "TRAINER_MODE", "TRAINER_MODULE", "check_registered", "check_version", "register",
           "registration_problems", "verl_version"]
