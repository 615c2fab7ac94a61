"""Shared fixtures: one RL engine (the real vLLM engine core on the embedded model) per session.

vLLM starts its engine processes with spawn, so the engine is built lazily by the
first test that asks for it and shut down at the end of the session.  The engines only
the engine tier uses (in-process, synchronous DAS) are in ``tests/engine/conftest.py``,
one per module that asks.
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
    from vllm_rl.task import MODEL_PATH

    llm = LLM(MODEL_PATH, seed=0, max_model_len=MAX_MODEL_LEN)
    yield llm
    shutdown(llm)


def inproc_engine(**kwargs):
    """``vllm_rl.LLM`` on the embedded model with the engine core in this process
    (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, for this call only); ``kwargs`` go to it."""
    import os

    from vllm_rl import LLM
    from vllm_rl.task import MODEL_PATH

    old = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    try:
        return LLM(MODEL_PATH, seed=0, max_model_len=MAX_MODEL_LEN, **kwargs)
    finally:
        if old is None:
            os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING")
        else:
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = old


@pytest.fixture(scope="session")
def das_llm():
    """``vllm_rl.LLM(das=...)``: the DAS drafter in vLLM's custom_class slot, with async
    scheduling as on a GPU (``vllm_rl_async_cpu``: vLLM's CPU platform would schedule it
    synchronously), the linear batch cap (the policy tests need budgets that do not
    depend on this machine's step times) and an ARRoL head (the all-four tests)."""
    from vllm_rl import LLM
    from vllm_rl.settings import CPU_ASYNC_KEY
    from vllm_rl.task import MODEL_PATH

    llm = LLM(MODEL_PATH, seed=0, max_model_len=MAX_MODEL_LEN, das={"batch_cap": "linear"},
              arrol=True, additional_config={CPU_ASYNC_KEY: True})
    yield llm
    shutdown(llm)


@pytest.fixture(scope="session")
def arrol_llm():
    """``vllm_rl.LLM(arrol=True)``: ARRoL's head on the V1 runner, multiprocess engine core
    (the verdicts cross vLLM's executor with the step's output)."""
    from vllm_rl import LLM
    from vllm_rl.task import MODEL_PATH

    llm = LLM(MODEL_PATH, seed=0, max_model_len=MAX_MODEL_LEN, arrol=True)
    yield llm
    shutdown(llm)


@pytest.fixture(scope="session")
def prompts():
    from vllm_rl.task import heldout_prompts

    return heldout_prompts(64)


def shortest_violations(infos, m: int) -> list[str]:
    """Why a DARTS early-stop group's training group is not its M shortest (empty: it is).

    Exact rule: the ``m`` selected samples are valid; every cancelled or valid but
    unselected sample is at least as long as the longest selected one, and a valid
    unselected one of equal length finished later (rank).  Samples that ended invalid by
    their own policy (DUET abort, client abort) never compete, at any length, nor do
    DUET's eps-kept ones (always selected, beside the M).
    """
    from vllm_rl import Reason

    sel = [i for i in infos if i.selected and not i.eps_kept]   # DUET's tail: beside M
    if not any(i.reason is Reason.DARTS_CANCELLED for i in infos):
        return []                       # the group ran to its end: nothing was cut
    bad = []
    if len(sel) != m or not all(i.valid and i.selection == "shortest" for i in sel):
        bad.append(f"selected {[(i.reason.value, i.length) for i in sel]}, want {m} valid")
    longest = max((i.length, i.finish_rank) for i in sel) if sel else (0, 0)
    for i in infos:
        if i.selected or i.eps_kept or i.reason in (Reason.DUET_ABORTED, Reason.ARROL_PRUNED,
                                                    Reason.ABORT):
            continue
        if i.length < longest[0]:
            bad.append(f"{i.reason.value} sample of {i.length} tokens is shorter than a "
                       f"selected one of {longest[0]}")
        elif i.valid and (i.length, i.finish_rank) < longest:
            bad.append(f"valid sample {(i.length, i.finish_rank)} beats selected {longest}")
    return bad
