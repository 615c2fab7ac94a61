"""The engines only the engine tier uses, one per module that asks (shut down at its end,
so the integration tier's Ray clusters get their memory back).

``tests/engine`` is a package (its ``__init__.py``) so that this file and
``tests/conftest.py`` import under different names: the tests' ``from conftest import``
reads the shared one."""
from __future__ import annotations

import pytest

from conftest import MAX_MODEL_LEN, inproc_engine, shutdown


@pytest.fixture(scope="module")
def inproc_llm():
    """``vllm_rl.LLM`` with the engine core in this process
    (``VLLM_ENABLE_V1_MULTIPROCESSING=0``): ``llm_engine.step()`` is exactly one engine
    step, and the scheduler can be read between steps.  One per module: shared across the
    tier, the reload tests failed on it ("pipeline model parallel group is not
    initialized") once ``test_partial_faults.py``'s own in-process engines had shut down
    beside it, since an in-process engine's shutdown tears down the process's
    model-parallel groups."""
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
