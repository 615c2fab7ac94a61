"""DUET in the real engine: marker trim, the seeded gate coin, the kept share, and DARTS beside it."""
import math
import re

import pytest
from conftest import shortest_violations
from vllm import SamplingParams

from vllm_rl import Reason, rl_params
from vllm_rl.duet.rule import seeded_coin

pytestmark = pytest.mark.engine
THIRD_STEP = r"(= \d+ ;[^=]*){3}"   # a user marker: the model has finished its third step


def _sp(seed, n=8, max_tokens=256, **duet):
    return SamplingParams(n=n, temperature=1.0, max_tokens=max_tokens, seed=seed,
                          extra_args=rl_params(duet=duet))


def test_a_fired_marker_ends_the_sample_at_the_poll_that_sees_it(rl_llm, prompts):
    tok = rl_llm.get_tokenizer()
    outs = rl_llm.generate(prompts[:8], _sp(3, k1=6, poll=4, k2=10_000, pattern=THIRD_STEP),
                           use_tqdm=False)
    trimmed = 0
    for out in outs:
        for c in out.outputs:
            info = c.rollout_info
            assert info.reason in (Reason.DUET_TRIMMED, Reason.EOS)
            if info.reason is Reason.EOS:
                continue
            trimmed += 1
            assert info.valid and info.weight == 1.0 and info.keep_prob == 1.0
            assert info.marker_pos == info.length == len(c.token_ids) >= 6
            assert re.search(THIRD_STEP, c.text)
            earlier = info.marker_pos - 4          # the previous poll saw no marker
            if earlier >= 6:
                assert not re.search(THIRD_STEP, tok.decode(c.token_ids[:earlier]))
            assert c.finish_reason == "abort"
    assert trimmed >= 24


def test_unmarked_samples_past_k2_plus_g_follow_their_seeded_coin(rl_llm, prompts):
    seed, k2, grace, eps = 21, 20, 10, 0.5
    outs = rl_llm.generate(prompts[8:16], _sp(seed, k1=0, k2=k2, grace=grace, eps=eps,
                                              pattern="NEVER"), use_tqdm=False)
    seen = {"aborted": 0, "kept": 0}
    for out in outs:
        for i, c in enumerate(out.outputs):
            info = c.rollout_info
            if info.length < k2 + grace and info.reason is not Reason.DUET_ABORTED:
                assert info.keep_prob == 1.0 and info.weight == 1.0   # ended before the gate
                continue
            coin = seeded_coin(seed + i, out.prompt_token_ids, "")   # child i has seed + i
            assert info.keep_prob == eps
            if coin >= eps:
                seen["aborted"] += 1
                assert info.reason is Reason.DUET_ABORTED and info.weight == 0.0
                assert info.length == len(c.token_ids) == k2 + grace and c.logprobs is None
                assert c.finish_reason == "abort" and c.text
            else:
                seen["kept"] += 1
                assert info.reason in (Reason.EOS, Reason.LENGTH) and info.weight == 1 / eps
    assert seen["aborted"] > 0 and seen["kept"] > 0


def test_kept_share_matches_eps(rl_llm, prompts):
    """Two-sided exact binomial test at alpha = 0.001 on the samples that reach the gate."""
    eps = 0.2
    outs = rl_llm.generate(prompts, _sp(5, k1=0, k2=6, grace=4, eps=eps, pattern="NEVER"),
                           use_tqdm=False)
    infos = [c.rollout_info for o in outs for c in o.outputs]
    gated = [i for i in infos if i.keep_prob == eps]
    kept = sum(i.reason is not Reason.DUET_ABORTED for i in gated)
    n = len(gated)
    assert n >= 400
    pmf = [math.comb(n, j) * eps**j * (1 - eps) ** (n - j) for j in range(n + 1)]
    p_value = sum(p for p in pmf if p <= pmf[kept] * (1 + 1e-9))
    assert p_value > 0.001, (kept, n)


def test_duet_and_darts_in_one_request(rl_llm, prompts):
    sp = SamplingParams(n=8, temperature=1.0, max_tokens=256, seed=4, extra_args=rl_params(
        group={"size": 3}, darts={"mode": "shortest"},
        duet={"k1": 0, "k2": 30, "grace": 10, "eps": 0.3, "pattern": "NEVER"}))
    tail = 0
    for out in rl_llm.generate(prompts[20:28], sp, use_tqdm=False):
        infos = [c.rollout_info for c in out.outputs]
        valid = [i for i in infos if i.valid and not i.eps_kept]
        in_m = [i for i in infos if i.selected and not i.eps_kept]
        if any(i.reason is Reason.DARTS_CANCELLED for i in infos):
            assert len(valid) >= 3 and len(in_m) == 3
            assert shortest_violations(infos, 3) == []
        assert all(i.length <= 40 for i in infos if i.reason is Reason.DUET_ABORTED)
        assert all(not i.selected for i in infos
                   if i.reason in (Reason.DUET_ABORTED, Reason.DARTS_CANCELLED))
        assert len(in_m) <= 3
        # the composition rule: DUET's coin keeps its eps inside the group, and a sample
        # it kept is never cancelled, always selected, with weight 1/eps (Eq. 6)
        for i in infos:
            if i.eps_kept:
                tail += 1
                assert i.reason is not Reason.DARTS_CANCELLED and i.length > 40
                assert i.selected and i.selection == "eps_kept"
                assert i.keep_prob == 0.3 and i.weight == pytest.approx(1 / 0.3)
    assert tail > 0


def test_regime_gate_keeps_every_sample_once_the_share_is_above_the_papers(rl_llm, prompts):
    """``duet.regime_gate``: once 256 samples of a marker kind have ended with more than 6%
    reaching K2 + G with no marker (here all: the model never writes ``<answer>``), the
    next round's requests that asked for it are kept whole at weight 1, their records
    saying why; a request that did not ask keeps the paper's gate."""
    from vllm_rl import metrics as rlm

    duet = dict(marker="qa", k1=0, k2=6, grace=4, eps=0.2, regime_gate=True)
    first = rl_llm.generate(prompts[:40], _sp(31, **duet), use_tqdm=False)   # 320 samples
    assert any(c.rollout_info.reason is Reason.DUET_ABORTED for o in first for c in o.outputs)
    outs = rl_llm.generate(prompts[40:44], _sp(32, **duet), use_tqdm=False)
    for c in (c for o in outs for c in o.outputs):
        info = c.rollout_info
        assert info.gate_open is False and info.markerless_share > 0.06
        assert info.reason in (Reason.EOS, Reason.LENGTH) and info.weight == 1.0
        assert info.keep_prob == 1.0 and not info.eps_kept
    assert rlm.snapshot()["vllm_rl:duet_gate_open"] == 0.0
    paper = dict(duet, regime_gate=False)
    outs = rl_llm.generate(prompts[44:48], _sp(33, **paper), use_tqdm=False)
    infos = [c.rollout_info for o in outs for c in o.outputs]
    assert all(i.gate_open for i in infos)
    assert any(i.reason is Reason.DUET_ABORTED for i in infos)
