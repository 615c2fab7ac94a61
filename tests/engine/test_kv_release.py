"""Early stop frees the cancelled requests' KV blocks in the step that stops the group.

The engine core runs in-process (``inproc_llm``: ``VLLM_ENABLE_V1_MULTIPROCESSING=0``)
so the test can read the real scheduler's block pool between steps.
"""
import pytest
from vllm import SamplingParams

from vllm_rl import Reason, rl_params
from vllm_rl.outcome import record_of

pytestmark = pytest.mark.engine


def _scheduler(llm):
    return llm.llm_engine.engine_core.engine_core.scheduler


def _blocks_in_use(sched) -> int:
    ids = set()
    for req_id in sched.requests:
        for group in sched.kv_cache_manager.get_block_ids(req_id):
            ids.update(group)
    return len(ids)


def test_cancelled_blocks_are_freed_in_the_same_step(inproc_llm, prompts):
    engine, sched = inproc_llm.llm_engine, _scheduler(inproc_llm)
    pool = sched.kv_cache_manager.block_pool
    idle_free = pool.get_num_free_blocks()
    assert not sched.requests

    # A long stock request keeps running while a DARTS group stops early beside it.
    engine.add_request("long", prompts[0], SamplingParams(max_tokens=200, ignore_eos=True))
    engine.add_request("group", prompts[1], SamplingParams(
        n=8, temperature=1.0, max_tokens=256, seed=5,
        extra_args=rl_params(group={"size": 2}, darts={"mode": "shortest"})))
    cancelled_seen = False
    for _ in range(400):
        outs = engine.step()
        cancelled = [c for o in outs for c in o.outputs
                     if (i := record_of(c)) and i.reason is Reason.DARTS_CANCELLED]
        if cancelled and not cancelled_seen:
            cancelled_seen = True
            group_left = [r for r in sched.requests if r != "long" and not r.startswith("long")]
            assert group_left == []                      # gone from the scheduler ...
            assert pool.get_num_free_blocks() == idle_free - _blocks_in_use(sched)  # ... blocks back
            assert len(sched.rl_groups) == 0 and not sched.rl_members
            assert any(r.startswith("long") for r in sched.requests)  # the stock request runs on
        if not engine.has_unfinished_requests():
            break
    assert cancelled_seen
    assert not sched.requests
    assert pool.get_num_free_blocks() == idle_free


def test_block_pool_returns_to_idle_after_a_darts_step(inproc_llm, prompts):
    sched = _scheduler(inproc_llm)
    idle_free = sched.kv_cache_manager.block_pool.get_num_free_blocks()
    sp = SamplingParams(n=8, temperature=1.0, max_tokens=256, seed=9,
                        extra_args=rl_params(group={"size": 4}, darts={"mode": "shortest"}))
    outs = inproc_llm.generate(prompts[:16], sp, use_tqdm=False)
    assert any(record_of(c).reason is Reason.DARTS_CANCELLED for o in outs for c in o.outputs)
    assert sched.kv_cache_manager.block_pool.get_num_free_blocks() == idle_free
    assert not sched.requests and not sched.rl_members and len(sched.rl_groups) == 0
