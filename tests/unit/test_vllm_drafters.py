"""On an engine whose drafter is vLLM's own (not DAS's), the RL schedulers schedule
drafts exactly as vLLM's do, placeholders included, for flagless and flagged requests.

vLLM's scheduler tests drive a scheduler with no engine and no worker
(``tests/v1/core/utils.py``); the same harness (:func:`standalone_scheduler`) runs
vLLM's ``AsyncScheduler`` / ``Scheduler`` and the project's ``RLScheduler`` /
``RLSyncScheduler`` side by side on the same requests and the same model outputs, with
``ngram`` and ``ngram_gpu`` configured, and compares every step's schedule: tokens,
draft ids (the async scheduler's ``-1`` placeholders) and ``num_spec_tokens_to_schedule``.
"""
from __future__ import annotations

import pytest
from vllm.sampling_params import SamplingParams
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput
from vllm.v1.request import Request

from vllm_rl import rl_params
from vllm_rl.bench.overhead.scheduler import standalone_scheduler
from vllm_rl.engine.scheduler import RLScheduler, RLSyncScheduler
from vllm_rl.flags import KEY, read

EOS = 0
TOK = 7
K = 2
PAIRS = [(AsyncScheduler, RLScheduler), (Scheduler, RLSyncScheduler)]
DRAFTERS = [{"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_max": 3,
             "prompt_lookup_min": 2},
            {"method": "ngram_gpu", "num_speculative_tokens": K, "prompt_lookup_max": 3,
             "prompt_lookup_min": 2}]
# A flagless request and two with flags the engine serves without DAS (a DUET gate, a
# DARTS group): none of them asks for DAS, all of them get vLLM's drafts.
REQUESTS = {"plain": None,
            "duet": rl_params(duet={"k1": 2, "k2": 40, "grace": 8, "eps": 0.5}),
            "darts": rl_params(group={"id": "g", "size": 1, "redundant": 1},
                               darts={"mode": "shortest"})}


def _request(rid: str, flags: dict | None) -> Request:
    extra = None if flags is None else {KEY: read(flags, n=1, default_group_id=rid).canonical()}
    params = SamplingParams(max_tokens=12, seed=1, extra_args=extra)
    params.update_from_generation_config({}, eos_token_id=EOS)
    return Request(rid, [3, 4, 5, 6, 8, 9, 3, 4], params, None)


def _schedules(cls, speculative: dict, steps: int = 6) -> list:
    """Each step's schedule on a scheduler of ``cls``: per request (tokens, draft ids),
    and ``num_spec_tokens_to_schedule``.  Every step the model accepts the first draft
    token and samples one (the worker's output is the same for both classes), and a
    synchronous scheduler is handed the drafts a synchronous worker would propose."""
    sched = standalone_scheduler(cls, max_num_seqs=8, max_model_len=256, num_blocks=64,
                                 speculative=speculative)
    for rid, flags in REQUESTS.items():
        sched.add_request(_request(rid, flags))
    out = []
    for _ in range(steps):
        so = sched.schedule()
        ids = list(so.num_scheduled_tokens)
        spec = so.scheduled_spec_decode_tokens
        out.append(({r: (so.num_scheduled_tokens[r], list(spec.get(r, ()))) for r in ids},
                    so.num_spec_tokens_to_schedule))
        sampled = [[TOK] * (1 + min(1, len(spec.get(r, ())))) for r in ids]
        mro = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                sampled_token_ids=sampled)
        sched.update_from_output(so, mro)
        if not isinstance(sched, AsyncScheduler):
            sched.update_draft_token_ids(DraftTokenIds(ids, [[TOK] * K for _ in ids]))
    return out


@pytest.mark.parametrize("speculative", DRAFTERS, ids=lambda s: s["method"])
@pytest.mark.parametrize("stock,ours", PAIRS, ids=["async", "sync"])
def test_vllm_drafter_keeps_drafting_on_the_rl_scheduler(stock, ours, speculative):
    theirs = _schedules(stock, speculative)
    mine = _schedules(ours, speculative)
    assert mine == theirs
    # the drafter does draft: every request gets K draft slots once it decodes
    assert all(len(d) == K for per, _ in theirs[2:] for _, d in per.values())


def _das_schedules(decisions: list[tuple[bool, frozenset | None]]) -> list[dict]:
    """On an engine whose drafter is DAS's: each step's draft placeholders by request,
    the drafter's decision after step i being ``decisions[i]`` (``StepOutput.drafting``
    and ``drafts_for``, as the worker attaches them).  Three DAS samples and a flagless
    request; the worker verifies no draft (every placeholder rejected)."""
    from vllm_rl.das.config import DASConfig
    from vllm_rl.step_output import attach

    sched = standalone_scheduler(RLScheduler, max_num_seqs=8, max_model_len=256,
                                 num_blocks=64,
                                 speculative=DASConfig.of({}).engine_kwargs()["speculative_config"])
    assert sched.rl_das.drafter
    for rid in ("a", "b", "c"):
        sched.add_request(_request(rid, rl_params(das={})))
    sched.add_request(_request("plain", None))
    out = []
    for drafting, drafts_for in decisions:
        so = sched.schedule()
        ids = list(so.num_scheduled_tokens)
        spec = so.scheduled_spec_decode_tokens
        out.append({r: len(spec.get(r, ())) for r in ids})
        mro = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                sampled_token_ids=[[TOK] for _ in ids])
        step = attach(mro)
        step.drafting, step.drafts_for, step.drafts = drafting, drafts_for, {}
        sched.update_from_output(so, mro)
    return out


def test_das_placeholders_follow_the_drafters_decision():
    """DAS's placeholders go where its drafter drafts: every DAS sample while it drafts
    for all, only the requests of a probe while it drafts for a few, none while its batch
    cap has drafting off; the flagless request never gets any.  The decision that came
    with step i's output shapes the schedule of step i + 2 (the async scheduler set step
    i + 1's placeholders before it)."""
    from vllm_rl.das.config import DASConfig

    k = DASConfig.of({}).num_speculative_tokens
    steps = _das_schedules([(True, None), (True, None), (True, frozenset({"b"})),
                            (True, frozenset({"b"})), (False, None), (False, None),
                            (True, None)])
    every, probe, off = ({"a": k, "b": k, "c": k, "plain": 0},
                         {"a": 0, "b": k, "c": 0, "plain": 0},
                         {"a": 0, "b": 0, "c": 0, "plain": 0})
    assert steps[1:] == [every, every, every, probe, probe, off]


def test_the_rules_walk_only_the_samples_a_rule_may_end():
    """A sample with DAS flags alone has no per-step rule, so the scheduler does not walk
    it after each step (the default combination's samples cost the rules nothing); DUET
    and DARTS samples are walked, and each leaves the walk when vLLM frees it."""
    from vllm_rl.das.config import DASConfig
    from vllm_rl.step_output import attach

    sched = standalone_scheduler(RLScheduler, max_num_seqs=8, max_model_len=256,
                                 num_blocks=64,
                                 speculative=DASConfig.of({}).engine_kwargs()["speculative_config"])
    for rid in ("a", "b"):
        sched.add_request(_request(rid, rl_params(das={})))
    for rid, flags in REQUESTS.items():
        sched.add_request(_request(rid, flags))
    assert set(sched.rl_members) == {"a", "b", "duet", "darts"}
    assert set(sched._ruled) == {"duet", "darts"}
    for _ in range(20):
        so = sched.schedule()
        ids = list(so.num_scheduled_tokens)
        if not ids:
            break
        mro = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                sampled_token_ids=[[TOK] for _ in ids])
        step = attach(mro)
        step.drafting, step.drafts_for, step.drafts = False, None, {}
        sched.update_from_output(so, mro)
    assert not sched.rl_members and not sched._ruled
