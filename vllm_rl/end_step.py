"""End a trainer step on a running RL engine, from any client (partial rollouts).

A drop-in whose step runs on several engines (verl's replicas, OpenRLHF's rollout
actors), or a trainer that drives the server over HTTP, counts the step's complete
groups itself and ends the step on each engine: the engine-core utility
``vllm_rl_end_step`` (``patches/engine_core.py``) calls the scheduler's
``rl_end_step`` (:meth:`vllm_rl.engine.steps.StepBook.end`), and the step's samples
still generating come back ``carried`` at the engine's next step.

The step is read as ``partial.step`` is (:func:`vllm_rl.flags.read_step`: an int >= 0,
never a bool, float or string) here, at the caller, before anything reaches the engine
core: a bad step is a :class:`~vllm_rl.flags.FlagError` naming ``partial.step``, with no
traceback in the engine's log.  The answer is how many of the step's samples were live
(0 for a step the engine does not hold: unknown, or every sample already gone).
"""
from __future__ import annotations

from typing import Any

from vllm_rl.flags import read_step

UTILITY = "vllm_rl_end_step"        # the engine-core utility (patches/engine_core.py)


def end_step(llm: Any, step: int) -> int:
    """End trainer step ``step`` on a ``vllm.LLM`` of the RL engine now."""
    step = read_step(step)
    client = llm.llm_engine.engine_core
    if hasattr(client, "call_utility"):          # the engine core in its own process
        return client.call_utility(UTILITY, step)
    return client.engine_core.vllm_rl_end_step(step)


async def end_step_async(engine: Any, step: int) -> int:
    """:func:`end_step` on an ``AsyncLLM`` (the server, verl's replica, OpenRLHF's actor)."""
    step = read_step(step)
    return await engine.engine_core.call_utility_async(UTILITY, step)


__all__ = ["UTILITY", "end_step", "end_step_async"]
