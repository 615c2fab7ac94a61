"""Shared fixtures: one RL engine (the real vLLM engine core on the embedded model) per session.

vLLM starts its engine processes with spawn, so the engine is built lazily by the
first test that asks for it and shut down at the end of the session.
"""
from __future__ import annotations

import gc

import pytest

MAX_MODEL_LEN = 512
MAX_TOKENS = 256


def shutdown(llm) -> None:
    try:
        llm.llm_engine.engine_core.shutdown()
    finally:
        del llm
        gc.collect()


@pytest.fixture(scope="session")
def rl_llm():
    """``vllm_rl.LLM`` on the embedded model, multiprocess engine core (the user's path)."""
    from vllm_rl import LLM

    llm = LLM(seed=0, max_model_len=MAX_MODEL_LEN)
    yield llm
    shutdown(llm)


@pytest.fixture(scope="session")
def das_llm():
    """``vllm_rl.LLM(das=True)``: the DAS drafter in vLLM's custom_class slot, sync scheduling."""
    from vllm_rl import LLM

    llm = LLM(seed=0, max_model_len=MAX_MODEL_LEN, das=True)
    yield llm
    shutdown(llm)


@pytest.fixture(scope="session")
def prompts():
    from vllm_rl.task import heldout_prompts

    return heldout_prompts(64)
