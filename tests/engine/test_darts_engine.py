"""DARTS in the real engine: exact early stop, dual-end marks, groups sent as separate
requests, staggered admission."""
import math

import pytest
from conftest import shortest_violations
from vllm import SamplingParams

from vllm_rl import Reason, rl_params

pytestmark = pytest.mark.engine
M, M_PRIME = 4, 8


def _params(mode, seed=1, **extra):
    return SamplingParams(n=M_PRIME, temperature=1.0, max_tokens=256, seed=seed, logprobs=0,
                          extra_args=rl_params(group={"size": M}, darts={"mode": mode, **extra}))


@pytest.fixture(scope="module")
def early_stop_outputs(rl_llm, prompts):
    return rl_llm.generate(prompts[:12], _params("shortest"), use_tqdm=False)


def test_early_stop_returns_exactly_m_finished(early_stop_outputs):
    stopped = 0
    for out in early_stop_outputs:
        infos = [c.rollout_info for c in out.outputs]
        valid = [i for i in infos if i.valid]
        cancelled = [i for i in infos if i.reason is Reason.DARTS_CANCELLED]
        assert len({i.group_id for i in infos}) == 1
        selected = [i for i in infos if i.selected]
        if cancelled:
            stopped += 1
            assert len(selected) == M and len(valid) >= M
            assert len(valid) + len(cancelled) + sum(i.reason is Reason.LENGTH for i in infos) == M_PRIME
            assert all(i.weight == 0.0 and not i.selected for i in cancelled)
            assert sorted(i.finish_rank for i in valid) == sorted(set(i.finish_rank for i in valid))
            assert all(i.valid and i.selection == "shortest" and i.weight == 1.0 for i in selected)
            assert all(i.weight == 0.0 for i in valid if not i.selected)
            assert shortest_violations(infos, M) == []
        else:  # the M shortest were only known once every sample had ended
            assert len(selected) == min(M, M_PRIME)
    assert stopped >= len(early_stop_outputs) // 2


def test_cancelled_samples_keep_partial_tokens_and_real_logprobs(early_stop_outputs):
    seen = 0
    for out in early_stop_outputs:
        valid_lengths = sorted(c.rollout_info.length for c in out.outputs if c.rollout_info.valid)
        for c in out.outputs:
            info = c.rollout_info
            assert info.length == len(c.token_ids)
            assert c.logprobs is not None and len(c.logprobs) == len(c.token_ids)
            for tok, lp in zip(c.token_ids, c.logprobs):
                assert tok in lp and math.isfinite(lp[tok].logprob) and lp[tok].logprob <= 0
            if info.reason is Reason.DARTS_CANCELLED:
                seen += 1
                assert c.finish_reason == "abort"
                assert len(c.token_ids) > 0 and c.text
                # Cancelled once the M shortest were known: at least as long as them.
                assert len(c.token_ids) >= valid_lengths[M - 1]
    assert seen > 0


def test_cancelled_logprobs_match_rescoring(rl_llm, early_stop_outputs):
    """The partial output's logprobs are the model's: rescore the same tokens as a prompt."""
    out = next(o for o in early_stop_outputs
               if any(c.rollout_info.reason is Reason.DARTS_CANCELLED for c in o.outputs))
    c = next(c for c in out.outputs if c.rollout_info.reason is Reason.DARTS_CANCELLED)
    ids = list(out.prompt_token_ids) + list(c.token_ids)
    scored = rl_llm.generate({"prompt_token_ids": ids},
                             SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0),
                             use_tqdm=False)[0]
    rescored = [scored.prompt_logprobs[len(out.prompt_token_ids) + j][t].logprob
                for j, t in enumerate(c.token_ids)]
    produced = [lp[t].logprob for t, lp in zip(c.token_ids, c.logprobs)]
    assert max(abs(a - b) for a, b in zip(rescored, produced)) < 0.05


def test_separate_requests_form_the_same_group(rl_llm, prompts):
    """verl sends M' single requests sharing a group id; they behave like one n=M' request.

    (Tokens are not compared: single requests may enter the engine a step apart, so the
    step at which the group stops can fall at another point of each sample.)
    """
    prompt, seed = prompts[3], 7
    one = rl_llm.generate(prompt, _params("shortest", seed=seed), use_tqdm=False)[0].outputs
    sps = [SamplingParams(n=1, temperature=1.0, max_tokens=256, seed=seed + i, logprobs=0,
                          extra_args=rl_params(group={"id": "sep-3", "size": M, "redundant": M_PRIME},
                                               darts={"mode": "shortest"}))
           for i in range(M_PRIME)]
    many = [o.outputs[0] for o in rl_llm.generate([prompt] * M_PRIME, sps, use_tqdm=False)]
    for group, gid in ((one, one[0].rollout_info.group_id), (many, "sep-3")):
        infos = [c.rollout_info for c in group]
        assert {i.group_id for i in infos} == {gid}
        assert sum(bool(i.selected) for i in infos) == M
        cancelled = [i for i in infos if i.reason is Reason.DARTS_CANCELLED]
        assert cancelled and all(i.weight == 0 for i in cancelled)
        assert shortest_violations(infos, M) == []


def test_dual_end_marks_k_shortest_and_l_longest(rl_llm, prompts):
    k = 3
    outs = rl_llm.generate(prompts[12:20], _params("dual_end", k=k), use_tqdm=False)
    for out in outs:
        infos = [c.rollout_info for c in out.outputs]
        assert not any(i.reason is Reason.DARTS_CANCELLED for i in infos)  # runs to completion
        valid = sorted((i.length, j) for j, i in enumerate(infos) if i.valid)
        if len(valid) < M:
            continue
        shortest = {j for _, j in valid[:k]}
        longest = {j for _, j in valid[-(M - k):]}
        assert {j for j, i in enumerate(infos) if i.selection == "short"} == shortest
        assert {j for j, i in enumerate(infos) if i.selection == "long"} == longest
        assert all(not i.selected for i in infos if i.reason is Reason.LENGTH)
        assert sum(i.selected for i in infos) == M
        assert all((i.weight == 1.0) == bool(i.selected) for i in infos)


def test_requests_without_flags_carry_no_record(rl_llm, prompts):
    out = rl_llm.generate(prompts[0], SamplingParams(n=2, max_tokens=64, seed=3), use_tqdm=False)[0]
    for c in out.outputs:
        assert c.stop_reason is None or not str(c.stop_reason).startswith("vllm_rl:")
        assert c.rollout_info.group_id is None and c.rollout_info.weight == 1.0


def _single(gid, seed, m=M, m_prime=M_PRIME):
    return SamplingParams(n=1, temperature=1.0, max_tokens=256, seed=seed, extra_args=rl_params(
        group={"id": gid, "size": m, "redundant": m_prime}, darts={"mode": "shortest"}))


def test_staggered_admission_keeps_the_m_shortest(rl_llm, prompts):
    """Half of each group enters the engine 40 steps after the other half.

    Stopping at the M-th finish would keep the early half's M shortest and cancel the
    late half with fewer tokens than a selected sample (it fails here on every group
    whose early half has M valid samples within 40 + their length).  The exact rule waits
    until every late sibling has at least as many tokens as the M-th shortest.
    """
    from vllm_rl.llm import attach_rollout_info

    engine = rl_llm.llm_engine
    groups = {f"stagger-{j}": prompts[24 + j] for j in range(6)}
    params, outputs = {}, {}

    def add(half):
        for gid, prompt in groups.items():
            for i in range(half * M_PRIME // 2, (half + 1) * M_PRIME // 2):
                rid = f"{gid}/{i}"
                params[rid] = _single(gid, seed=100 + i)
                engine.add_request(rid, prompt, params[rid])

    def step():
        for out in engine.step():
            if out.finished:
                outputs[out.request_id] = out

    add(0)
    for _ in range(40):
        step()
    add(1)
    while engine.has_unfinished_requests():
        step()
    rids = sorted(outputs)
    outs = [outputs[r] for r in rids]
    attach_rollout_info(outs, [params[r] for r in rids])
    stopped = 0
    for gid in groups:
        infos = [o.outputs[0].rollout_info for r, o in zip(rids, outs) if r.startswith(gid + "/")]
        assert len(infos) == M_PRIME and sum(bool(i.selected) for i in infos) == M
        assert shortest_violations(infos, M) == [], (gid, infos)
        stopped += any(i.reason is Reason.DARTS_CANCELLED for i in infos)
        late = [i for i in infos[M_PRIME // 2:]]
        assert all(i.length > 0 for i in late)
    assert stopped >= 3
