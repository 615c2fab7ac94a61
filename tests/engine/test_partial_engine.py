"""Partial rollouts on the real engine: a step ends by its rule and carries the rest, a
continuation goes on where its sample stopped, on the current weights, and every record
covers the whole sample (``vllm_rl.engine.steps``, ``docs/ARCHITECTURE.md``, "Partial
rollouts").

The engine core runs in-process (``inproc_llm``); the storm is stepped by hand
(``LLMEngine.add_request`` / ``step``), so the token counts at each weight sync are
exact, with no thread and no clock.
"""
from __future__ import annotations

import random

import pytest
from vllm import SamplingParams

from vllm_rl import rl_params
from vllm_rl.engine.trace import engine_scheduler
from vllm_rl.outcome import Reason, RolloutInfo

pytestmark = pytest.mark.engine


def _ids(seed: int, n: int = 24) -> list[int]:
    return [3 + (seed * 7919 + 31 * i) % 40 for i in range(n)]


def _continue(llm, prompt_ids, part_ids, info, step, max_tokens, **extra):
    """``part_ids`` (a carried sample's tokens, ``info`` its record) sent again."""
    group = extra.pop("group", None)
    flags = rl_params(group=group, partial={
        "step": step, "start_step": info.start_step, "prior_tokens": len(part_ids),
        "seed": 0, "prior_versions": info.weight_versions or [[info.weight_version, 0]],
        **extra})
    sp = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, logprobs=0,
                        extra_args=flags)
    (out,) = llm.generate([{"prompt_token_ids": prompt_ids + part_ids}], [sp], use_tqdm=False)
    return out


def test_a_step_ends_once_its_rule_holds_and_carries_the_rest(inproc_llm):
    """Two of six groups complete, the step ends: the others' samples come back carried,
    with every token made so far and its logprob, weight 0, and their KV freed."""
    params = [SamplingParams(n=3, temperature=1.0, seed=10 + i, logprobs=0,
                             max_tokens=8 if i < 2 else 200, ignore_eos=i >= 2,
                             extra_args=rl_params(group={"size": 3},
                                                  partial={"step": 0, "until_groups": 2}))
              for i in range(6)]
    outs = inproc_llm.generate([{"prompt_token_ids": _ids(i)} for i in range(6)], params,
                               use_tqdm=False)
    complete = 0
    for out in outs:
        infos = [c.rollout_info for c in out.outputs]
        carried = [i.reason is Reason.CARRIED for i in infos]
        complete += not any(carried)
        for c, info in zip(out.outputs, infos):
            assert info.step == 0 and info.start_step == 0 and info.steps_crossed == 0
            assert info.length == len(c.token_ids) == len(c.logprobs)
            if info.reason is Reason.CARRIED:
                assert info.weight == 0.0 and c.finish_reason == "abort"
                assert 0 < info.length < 200
    assert complete >= 2 and sum(
        c.rollout_info.reason is Reason.CARRIED for o in outs for c in o.outputs) > 0
    sched = engine_scheduler(inproc_llm)
    assert not sched.requests and not sched.rl_members and not sched.rl_steps
    pool = sched.kv_cache_manager.block_pool
    assert pool.get_num_free_blocks() == pool.num_gpu_blocks - 1   # every block back


def test_a_step_ended_by_the_drop_in_carries_its_live_samples(inproc_llm):
    """A step with no rule of its own (a drop-in spread over engines counts the groups
    itself) runs until ``end_step`` (the engine-core utility); then its live samples end
    at the next engine step, carried, with every token so far; a step the engine does
    not hold answers 0."""
    from vllm_rl.integrations.common.partial import end_step

    engine, sched = inproc_llm.llm_engine, engine_scheduler(inproc_llm)
    assert end_step(inproc_llm, 41) == 0
    for i in range(4):
        engine.add_request(f"ended-{i}", {"prompt_token_ids": _ids(60 + i)}, SamplingParams(
            temperature=1.0, seed=i, max_tokens=200, ignore_eos=True, logprobs=0,
            extra_args=rl_params(group={"id": f"g{i // 2}", "size": 2},
                                 partial={"step": 42})))
    outs = [o for _ in range(6) for o in engine.step() if o.finished]
    assert not outs, "no rule: the step runs on"
    assert end_step(inproc_llm, 42) == 4
    while engine.has_unfinished_requests():
        outs += [o for o in engine.step() if o.finished]
    completions = [c for o in outs for c in o.outputs]
    assert len(completions) == 4
    for c in completions:
        info = c.rollout_info
        assert info.reason is Reason.CARRIED and info.step == 42
        assert 6 <= info.length == len(c.token_ids) < 200
    assert not sched.rl_steps and not sched.rl_members


def test_a_continuation_goes_on_where_its_sample_stopped(inproc_llm):
    """A greedy sample carried after 20 tokens and continued gives the tokens it would
    have given uncarried; its record counts the whole sample."""
    prompt = _ids(7)
    sp = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
    (whole,) = inproc_llm.generate([{"prompt_token_ids": prompt}], [sp], use_tqdm=False)
    tokens = list(whole.outputs[0].token_ids)
    first = RolloutInfo(reason=Reason.CARRIED, length=20, start_step=0, weight_version=
                        engine_scheduler(inproc_llm).rl_weight_version)
    out = _continue(inproc_llm, prompt, tokens[:20], first, step=1, max_tokens=28)
    c = out.outputs[0]
    assert list(c.token_ids) == tokens[20:]
    info = c.rollout_info
    assert (info.length, info.prior_tokens, info.start_step, info.steps_crossed) == (48, 20, 0, 1)


def test_a_weight_sync_while_carried_samples_wait(inproc_llm):
    """Carried, then a weight sync, then continued: the continuation is recomputed on the
    new weights (no cached block of the old ones), and its spans say where each
    version's tokens begin."""
    from vllm_rl.weights import weight_sync

    params = [SamplingParams(n=2, temperature=1.0, seed=3 + i, logprobs=0, ignore_eos=i > 0,
                             max_tokens=6 if i == 0 else 120,
                             extra_args=rl_params(group={"size": 2},
                                                  partial={"step": 4, "until_groups": 1}))
              for i in range(2)]
    prompts = [_ids(30), _ids(31)]
    outs = inproc_llm.generate([{"prompt_token_ids": p} for p in prompts], params,
                               use_tqdm=False)
    carried = [(c, c.rollout_info) for c in outs[1].outputs
               if c.rollout_info.reason is Reason.CARRIED]
    assert carried, [c.rollout_info.reason for c in outs[1].outputs]
    report = weight_sync(inproc_llm)
    version = report["weight_version"]
    c, info = carried[0]
    out = _continue(inproc_llm, prompts[1], list(c.token_ids), info, step=5, max_tokens=10)
    assert out.num_cached_tokens == 0, "a block of the old weights was read"
    whole = out.outputs[0].rollout_info
    n = len(c.token_ids)
    assert whole.weight_versions == [[info.weight_version, 0], [version, n]]
    assert (whole.length, whole.start_step, whole.steps_crossed) == (n + 10, 4, 1)


def _continued_group(llm, gid: str, ended: list, max_tokens: int, seed: int) -> list:
    """Two continuations (12 tokens so far each) of a DARTS group of M = 2, M' = 4 whose
    other two members ended in an earlier step as ``ended`` says; their records."""
    flags = rl_params(group={"id": gid, "size": 2, "redundant": 4},
                      darts={"mode": "shortest"},
                      partial={"step": 2, "start_step": 1, "prior_tokens": 12, "seed": 0,
                               "group_ended": ended})
    sps = [SamplingParams(temperature=1.0, seed=s, max_tokens=max_tokens, ignore_eos=True,
                          extra_args=flags) for s in (1, 2)]
    outs = llm.generate([{"prompt_token_ids": _ids(seed) + _ids(seed + 1, 12)}] * 2, sps,
                        use_tqdm=False)
    return [out.outputs[0].rollout_info for out in outs]


def test_a_darts_group_stops_across_steps(inproc_llm):
    """A DARTS group whose two shortest ended in an earlier step stops at its
    continuations' first step: they are longer already (exact shortest-M across steps)."""
    for info in _continued_group(inproc_llm, "across", [[5, True], [6, True]], 100, 40):
        assert info.reason is Reason.DARTS_CANCELLED and 12 <= info.length < 12 + 100


def test_a_carried_group_whose_others_were_pruned_or_cancelled(inproc_llm):
    """The group's other members ended invalid (pruned, cancelled) before: its carried
    members run to their own end, nothing stops them early."""
    for info in _continued_group(inproc_llm, "others-gone", [[5, False], [6, False]], 16, 42):
        assert info.reason is Reason.LENGTH and info.length == 28
        assert info.finish_rank in (3, 4)


def test_samples_past_the_staleness_cap_are_dropped_with_a_record(inproc_llm):
    params = [SamplingParams(n=2, temperature=1.0, seed=50 + i, max_tokens=6 if i == 0 else 150,
                             ignore_eos=i > 0,
                             extra_args=rl_params(group={"size": 2}, partial={
                                 "step": 7, "until_groups": 1, "max_staleness": 0}))
              for i in range(2)]
    outs = inproc_llm.generate([{"prompt_token_ids": _ids(60 + i)} for i in range(2)], params,
                               use_tqdm=False)
    reasons = [c.rollout_info.reason for c in outs[1].outputs]
    assert Reason.STALE in reasons and Reason.CARRIED not in reasons
    assert all(c.rollout_info.weight == 0.0 for c in outs[1].outputs
               if c.rollout_info.reason is Reason.STALE)


def test_storm_of_weight_syncs_while_carried_samples_are_resubmitted(inproc_llm):
    """Trainer steps of new groups and continuations, weight syncs at random engine
    steps: every final record's version spans are the syncs it ran across, at the token
    counts the engine had when each came (read between steps)."""
    engine, sched = inproc_llm.llm_engine, engine_scheduler(inproc_llm)
    rng = random.Random(0)
    live: dict[str, dict] = {}        # request id -> what the test knows of it
    carried: list[dict] = []
    finals: list[tuple[dict, RolloutInfo]] = []
    count = 0
    for step in range(5):
        version = sched.rl_weight_version
        batch = carried
        carried = []
        for i in range(3):
            batch.append({"prompt": _ids(100 + 10 * step + i), "tokens": [],
                          "spans": [], "start": step, "seed": 1000 * step + i})
        for s in batch:
            count += 1
            rid = f"storm-{count}"
            n0 = len(s["tokens"])
            partial = {"step": step, "until_groups": 2}
            if n0:
                partial.update(start_step=s["start"], prior_tokens=n0, seed=s["seed"],
                               prior_versions=s["spans"])
            sp = SamplingParams(temperature=1.0, seed=s["seed"] + n0, logprobs=0,
                                max_tokens=rng.choice([8, 60, 90]) if not n0 else 90 - n0,
                                ignore_eos=True, extra_args=rl_params(partial=partial))
            known = set(sched.requests)
            engine.add_request(rid, {"prompt_token_ids": s["prompt"] + s["tokens"]}, sp)
            (inner,) = set(sched.requests) - known      # the engine's own id for it
            s.update(rid=rid, inner=inner, n0=n0, own=[[version, n0]])
            live[rid] = s
        while live:
            if rng.random() < 0.15:                          # a weight sync now
                sched.reset_prefix_cache()
                version = sched.rl_weight_version
                for s in live.values():
                    req = sched.requests.get(s["inner"])
                    n = req.num_output_tokens if req is not None else 0
                    if n == 0:
                        s["own"] = [[version, s["n0"]]]
                    else:
                        s["own"].append([version, s["n0"] + n])
            for out in engine.step():
                if not out.finished:
                    continue
                s = live.pop(out.request_id)
                c = out.outputs[0]
                info = c.rollout_info
                spans = s["spans"] + s["own"]
                if s["spans"] and s["spans"][-1][0] == s["own"][0][0]:
                    spans = s["spans"] + s["own"][1:]
                assert info.length == s["n0"] + len(c.token_ids)
                expect = spans if len(spans) > 1 else None
                assert info.weight_versions == expect, (info, spans)
                assert info.weight_version == spans[0][0]
                if info.reason is Reason.CARRIED:
                    carried.append(dict(s, tokens=s["tokens"] + list(c.token_ids),
                                        spans=spans))
                else:
                    finals.append((s, info))
    assert finals and any(i.prior_tokens for _, i in finals), "no continuation finished"
    assert any(i.weight_versions for _, i in finals), "no sync was crossed"
    assert sched.rl_weight_version > 1 and not sched.requests
