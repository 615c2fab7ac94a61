"""Whether vllm_rl is registered with verl in this process (:func:`check_registered`, run
by the replica, the agent loop and ``python -m vllm_rl.integrations.verl``)."""
from __future__ import annotations

import sys

from vllm_rl.integrations.verl.keys import (ADAPTER_CLS, AGENT_LOOP, AGENT_LOOP_MODULE, NAME,
                                            TRAINER_MODE, TRAINER_MODULE)


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
