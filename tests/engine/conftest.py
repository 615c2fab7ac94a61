"""The engines only the engine tier uses.  The in-process engine is one for the whole tier
(``tests/engine`` is a package, so a package-scoped engine is shut down after the tier's
last test and the integration tier's Ray clusters get its memory back)."""
from __future__ import annotations

import pytest

from conftest import MAX_MODEL_LEN, inproc_engine, shutdown


@pytest.fixture(scope="package")
def inproc_llm():
    """``vllm_rl.LLM`` with the engine core in this process
    (``VLLM_ENABLE_V1_MULTIPROCESSING=0``): ``llm_engine.step()`` is exactly one engine
    step, and the scheduler can be read between steps.  A test leaves it as it found it:
    nothing running, waiting or carried, the served weights."""
    llm = inproc_engine()
    yield llm
    shutdown(llm)


@pytest.fixture(scope="module")
def sync_das_llm():
    """``das_llm`` with synchronous scheduling (``das={"async_scheduling": False}``, what
    a parallel engine runs), one per module that asks for it (the tier's bench runs start
    engines of their own beside the session's)."""
    from vllm_rl import LLM
    from vllm_rl.task import MODEL_PATH

    llm = LLM(MODEL_PATH, seed=0, max_model_len=MAX_MODEL_LEN,
              das={"batch_cap": "linear", "async_scheduling": False}, arrol=True)
    yield llm
    shutdown(llm)
