"""ARRoL in the real engine: capture at l_detect, verdicts, pruning, updates, flags.

Engines (conftest): ``arrol_llm`` (multiprocess engine core: verdicts cross vLLM's
executor) and ``das_llm`` (DAS + ARRoL head: capture inside multi-token steps, all four
techniques in one request).
"""
from __future__ import annotations

import math

import pytest
import torch
from vllm import SamplingParams
from vllm.exceptions import VLLMValidationError

from vllm_rl import Reason, rl_params
from vllm_rl.arrol.rule import BINS, prune_coin

# The engine computes in bf16 on the CPU (vLLM's default there), transformers in fp32:
# per element within bf16's resolution plus accumulated rounding, and the vectors agree in
# direction to 1e-3.  (Measured: max abs difference 0.017 on values up to ~3.)
HIDDEN_ATOL, HIDDEN_RTOL, MIN_COSINE = 0.05, 0.02, 0.999


def _assert_same_hidden(h, ref):
    assert torch.allclose(h, ref, atol=HIDDEN_ATOL, rtol=HIDDEN_RTOL), (h - ref).abs().max()
    assert torch.nn.functional.cosine_similarity(h, ref, dim=0) > MIN_COSINE


def _head(hidden: int, b2: float = 0.0, seed: int = 0, version: int = 1) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"version": version, "activation": "relu", "hidden_size": hidden, "width": 128,
            "w1": (torch.randn(128, hidden, generator=g) * 0.1).tolist(),
            "b1": (torch.randn(128, generator=g) * 0.1).tolist(),
            "w2": (torch.randn(128, generator=g) * 0.1).tolist(), "b2": b2}


def _flat_calibration(delta: float = 0.0) -> dict:
    """Empty counts: q = prior = 0.5 in every bin, so p = clip(κ + δ) for ρ = 0.5."""
    return {"pos": [0] * BINS, "neg": [0] * BINS, "alpha": 1.0, "prior": 0.5,
            "delta": delta, "bins": BINS}


def _infos(outs):
    return [(o, c, c.rollout_info) for o in outs for c in o.outputs]


@pytest.fixture(scope="module")
def hf_model():
    from transformers import AutoModelForCausalLM

    from vllm_rl.task import MODEL_PATH

    return AutoModelForCausalLM.from_pretrained(str(MODEL_PATH), dtype=torch.float32).eval()


def _hf_hidden(model, ids: list[int], pos: int) -> torch.Tensor:
    with torch.no_grad():
        out = model(torch.tensor([ids]), output_hidden_states=True)
    return out.hidden_states[-1][0, pos]          # after the final norm


def test_hidden_state_at_l_detect_equals_a_transformers_forward(arrol_llm, hf_model, prompts):
    L = 12
    outs = arrol_llm.generate(prompts[:4], SamplingParams(
        temperature=0, max_tokens=40, extra_args=rl_params(arrol={"l_detect": L,
                                                                  "return_hidden": True})),
        use_tqdm=False)
    checked = 0
    for o, c, info in _infos(outs):
        if len(c.token_ids) <= L:
            assert info.score is None
            continue
        # the record names the vector the worker kept; generate took it (arrol_hidden)
        assert info.hidden_id is not None and c.stop_reason is None
        h = torch.from_numpy(info.hidden_state().copy())
        ids = list(o.prompt_token_ids) + list(c.token_ids)
        ref = _hf_hidden(hf_model, ids[:len(o.prompt_token_ids) + L],
                         len(o.prompt_token_ids) + L - 1)
        _assert_same_hidden(h, ref)
        # and the score is the head's on that vector
        checked += 1
    assert checked >= 2


def test_exactly_the_samples_past_l_detect_are_scored_once(arrol_llm, prompts):
    L = 24
    before = arrol_llm.arrol_info()["scored"]
    outs = arrol_llm.generate(prompts[4:12], SamplingParams(
        n=4, temperature=1.0, max_tokens=64, seed=3,
        extra_args=rl_params(arrol={"l_detect": L})), use_tqdm=False)
    infos = [i for _, _, i in _infos(outs)]
    scored = [i for i in infos if i.score is not None]
    assert all((i.score is not None) == (i.length > L) for i in infos)
    assert all(0.0 <= i.score <= 1.0 and i.q is None and i.p is None and i.pruned is False
               for i in scored)                                    # cold start: no pruning
    assert arrol_llm.arrol_info()["scored"] - before == len(scored)
    plain = arrol_llm.generate(prompts[4:6], SamplingParams(max_tokens=40, temperature=0),
                               use_tqdm=False)
    assert all(c.rollout_info.score is None for o in plain for c in o.outputs)


def test_pruning_follows_the_seeded_coins_and_keeps_kappa(arrol_llm, prompts):
    """Flat calibration: p = 0.5 for every sample; pruned exactly when its coin >= p;
    the kept count is Binomial(N, 0.5) (exact two-sided test)."""
    L = 16
    v = arrol_llm.arrol_update(calibration=_flat_calibration())
    ps = prompts[:48]
    params = [SamplingParams(temperature=1.0, max_tokens=96, seed=1000 + i,
                             extra_args=rl_params(arrol={"l_detect": L}))
              for i in range(len(ps))]
    outs = arrol_llm.generate(ps, params, use_tqdm=False)
    arrol_llm.arrol_update(cold_start=True)
    kept = n = 0
    for sp, o in zip(params, outs):
        info = o.outputs[0].rollout_info
        if info.score is None:
            assert info.length <= L
            continue
        n += 1
        assert info.head_version == v and info.p == pytest.approx(0.5)
        coin = prune_coin(sp.seed, o.prompt_token_ids, "unused: the request is seeded")
        if coin >= info.p:                  # its coin prunes it ...
            if info.pruned:
                assert info.reason is Reason.ARROL_PRUNED and info.weight == 0.0
                assert o.outputs[0].finish_reason == "abort"
                assert len(o.outputs[0].token_ids) == info.length
            else:                           # ... unless it ended by itself in that step
                assert info.reason in (Reason.EOS, Reason.LENGTH)
            assert L < info.length <= L + 2     # ends in the step its verdict arrives
        else:
            kept += 1
            assert not info.pruned and info.reason is not Reason.ARROL_PRUNED
    assert n >= 30
    assert _binom_two_sided(kept, n, 0.5) > 1e-3, (kept, n)


def _binom_two_sided(k: int, n: int, p: float) -> float:
    pmf = [math.comb(n, j) * p ** j * (1 - p) ** (n - j) for j in range(n + 1)]
    return min(1.0, sum(x for x in pmf if x <= pmf[k] * (1 + 1e-12)))


def test_a_head_update_scores_from_the_next_step(arrol_llm, prompts):
    hidden = arrol_llm.arrol_info()["hidden_size"]
    sp = SamplingParams(temperature=0, max_tokens=24, extra_args=rl_params(
        arrol={"l_detect": 4}))
    v = arrol_llm.arrol_update(head=_head(hidden, b2=40.0), version=77)
    assert v == 77
    hi = [c.rollout_info for o in arrol_llm.generate(prompts[:3], sp, use_tqdm=False)
          for c in o.outputs]
    arrol_llm.arrol_update(head=_head(hidden, b2=-40.0))
    lo = [c.rollout_info for o in arrol_llm.generate(prompts[:3], sp, use_tqdm=False)
          for c in o.outputs]
    assert all(i.head_version == 77 and i.score > 0.99 for i in hi if i.length > 4)
    assert all(i.head_version == 78 and i.score < 0.01 for i in lo if i.length > 4)
    with pytest.raises(Exception, match="w1"):
        arrol_llm.arrol_update(head={**_head(hidden), "w1": [[0.0] * 3]})
    assert arrol_llm.arrol_info()["version"] == 78            # a bad update changes nothing


def test_bad_arrol_flags_rejected_while_others_are_served(arrol_llm, rl_llm, prompts):
    engine = arrol_llm.llm_engine
    good = SamplingParams(max_tokens=24, temperature=0,
                          extra_args=rl_params(arrol={"l_detect": 4}))
    engine.add_request("good-arrol", prompts[0], good)
    for bad, flag in (({"kappa": 1.5}, "arrol.kappa"), ({"l_detect": 0}, "arrol.l_detect"),
                      ({"p_min": 0.9, "p_max": 0.2}, "arrol.p_min"),
                      ({"gamma": 1}, "arrol.gamma")):
        with pytest.raises(VLLMValidationError, match=flag):
            engine.add_request(f"bad-{flag}", prompts[1], SamplingParams(
                max_tokens=4, extra_args={"vllm_rl": {"arrol": bad}}))
    done = []
    while engine.has_unfinished_requests():
        done += [o for o in engine.step() if o.finished]
    assert [o.request_id for o in done] == ["good-arrol"]
    with pytest.raises(VLLMValidationError, match="without an ARRoL quality head"):
        rl_llm.generate(prompts[:1], SamplingParams(
            max_tokens=4, extra_args=rl_params(arrol={})), use_tqdm=False)


@pytest.mark.parametrize("llm", ["sync_das_llm", "das_llm"])
def test_capture_inside_multi_token_das_steps(llm, hf_model, prompts, request):
    """Greedy rollouts fill the trees; the second pass drafts them back, so the l_detect
    crossing falls inside a verified multi-token step, and the vector is still the
    sample's own token's, under synchronous and async scheduling (``das_llm``: the
    drafts are the lookahead's, the position read from vLLM's corrected counts)."""
    das_llm = request.getfixturevalue(llm)
    L = 20
    ps = prompts[20:24]
    sp = SamplingParams(temperature=0, max_tokens=48, extra_args=rl_params(
        das={"policy": "fixed"}, arrol={"l_detect": L, "return_hidden": True}))
    das_llm.generate(ps, sp, use_tqdm=False)
    at_draft = das_llm.arrol_info()["scored_at_draft"]
    outs = das_llm.generate(ps, sp, use_tqdm=False)
    assert das_llm.arrol_info()["scored_at_draft"] > at_draft   # crossings inside a step
    accepted = 0
    for o, c, info in _infos(outs):
        accepted += info.draft_accepted
        if len(c.token_ids) <= L:
            continue
        ids = list(o.prompt_token_ids) + list(c.token_ids)
        ref = _hf_hidden(hf_model, ids[:len(o.prompt_token_ids) + L],
                         len(o.prompt_token_ids) + L - 1)
        h = torch.from_numpy(info.hidden_state().copy())
        _assert_same_hidden(h, ref)
    assert accepted > 0.5 * sum(len(c.token_ids) for o in outs for c in o.outputs)


def test_all_four_techniques_in_one_request(das_llm, prompts):
    from conftest import shortest_violations

    v = das_llm.arrol_update(calibration=_flat_calibration())
    L, m, n = 24, 4, 8
    sp = SamplingParams(n=n, temperature=1.0, max_tokens=160, seed=5, extra_args=rl_params(
        group={"size": m}, darts={"mode": "shortest"}, das={"policy": "fixed"},
        duet={"k1": 40, "k2": 100, "grace": 8, "eps": 0.2, "pattern": r"\\boxed\{[^}]*\}"},
        arrol={"l_detect": L}))
    outs = das_llm.generate(prompts[30:38], sp, use_tqdm=False)
    das_llm.arrol_update(cold_start=True)
    reasons = set()
    for o in outs:
        infos = [c.rollout_info for c in o.outputs]
        reasons |= {i.reason for i in infos}
        assert shortest_violations(infos, m) == []
        for c, i in zip(o.outputs, infos):
            assert i.draft_proposed is not None and i.draft_proposed >= i.draft_accepted >= 0
            assert i.length == len(c.token_ids)
            if i.length > L and i.reason is not Reason.DARTS_CANCELLED:
                # composition rule: in a DARTS group of 4 of 8, kappa 0.5 becomes 0.75
                assert i.score is not None and i.head_version == v and i.p == pytest.approx(0.75)
            if i.reason is Reason.ARROL_PRUNED:
                assert i.pruned and i.weight == 0.0 and not i.selected
            if i.selected and not i.eps_kept:
                assert i.reason.valid and i.weight > 0
            if i.eps_kept:          # DUET's tail: beside DARTS's M, never cancelled
                assert i.selected and i.weight == pytest.approx(1 / 0.2)
            if i.reason in (Reason.DUET_ABORTED,):
                assert i.weight == 0.0 and i.k2 == 100
    assert Reason.ARROL_PRUNED in reasons
    assert reasons & {Reason.DARTS_CANCELLED, Reason.DUET_ABORTED, Reason.DUET_TRIMMED}


def _trace_of(c, L: int) -> tuple[float, float]:
    """Mean and minimum of the returned (raw) log-probabilities of the first L tokens."""
    lps = [d[t].logprob for d, t in zip(c.logprobs[:L], c.token_ids[:L])]
    return sum(lps) / len(lps), min(lps)


def _assert_traces(outs, L: int) -> int:
    """Every record longer than L: its trace's mean and minimum are those of its first L
    returned log-probabilities.  Returns how many it checked."""
    checked = 0
    for _, c, info in _infos(outs):
        if info.length <= L:
            continue
        mean_lp, min_lp = _trace_of(c, L)
        assert info.trace[0] == pytest.approx(mean_lp, abs=1e-4)
        assert info.trace[1] == pytest.approx(min_lp, abs=1e-4)
        checked += 1
    return checked


def _hf_entropy(model, ids: list[int], start: int, count: int) -> float:
    """Mean entropy of the next-token distributions that produced ids[start:start+count]."""
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, start - 1:start - 1 + count].float()
    lp = torch.log_softmax(logits, -1)
    return float(-(lp.exp() * lp).sum(-1).mean())


def test_trace_features_are_the_first_l_detect_tokens(arrol_llm, hf_model, prompts):
    """The record's trace is the mean and minimum log-probability of the sample's first
    l_detect tokens (the engine's own, as vLLM returns them) and the mean entropy of the
    distributions they were drawn from (against a transformers forward)."""
    L = 16
    outs = arrol_llm.generate(prompts[:6], SamplingParams(
        n=2, temperature=1.0, max_tokens=48, seed=11, logprobs=0,
        extra_args=rl_params(arrol={"l_detect": L})), use_tqdm=False)
    checked = 0
    for o, c, info in _infos(outs):
        if info.length <= L:
            assert info.trace is None
            continue
        mean_lp, min_lp = _trace_of(c, L)
        assert info.trace[0] == pytest.approx(mean_lp, abs=1e-4)
        assert info.trace[1] == pytest.approx(min_lp, abs=1e-4)
        ids = list(o.prompt_token_ids) + list(c.token_ids)
        ent = _hf_entropy(hf_model, ids, len(o.prompt_token_ids), L)
        assert info.trace[2] == pytest.approx(ent, abs=0.05)        # bf16 engine vs fp32
        checked += 1
    assert checked >= 6


@pytest.mark.parametrize("llm", ["sync_das_llm", "das_llm"])
def test_trace_features_inside_multi_token_das_steps(llm, prompts, request):
    """With drafts accepted, a step brings several tokens: each counts once, a rejected
    draft never, and the scored draft position's own tokens are in the features, under
    synchronous and async scheduling (``das_llm``: the sampled ids read on the device)."""
    das_llm = request.getfixturevalue(llm)
    L = 20
    ps = prompts[24:28]
    sp = SamplingParams(temperature=0, max_tokens=48, logprobs=0, extra_args=rl_params(
        das={"policy": "fixed"}, arrol={"l_detect": L}))
    das_llm.generate(ps, sp, use_tqdm=False)                       # fills the trees
    at_draft = das_llm.arrol_info()["scored_at_draft"]
    outs = das_llm.generate(ps, sp, use_tqdm=False)
    assert _assert_traces(outs, L) >= 2
    assert sum(i.draft_accepted for _, _, i in _infos(outs)) > 0
    assert das_llm.arrol_info()["scored_at_draft"] > at_draft


@pytest.mark.parametrize("llm", ["sync_das_llm", "das_llm"])
def test_trace_features_of_sampled_rollouts_with_rejected_drafts(llm, prompts, request):
    """Sampled rollouts drafted from their siblings' trees: drafts are accepted and
    rejected before l_detect, and every record's trace is still the mean and minimum
    log-probability of its own first l_detect tokens, as vLLM returns them."""
    das_llm = request.getfixturevalue(llm)
    L = 24
    ps = prompts[28:32]
    sp = SamplingParams(n=4, temperature=1.0, max_tokens=64, seed=21, logprobs=0,
                        extra_args=rl_params(das={"policy": "fixed"}, arrol={"l_detect": L}))
    das_llm.generate(ps, sp, use_tqdm=False)                       # fills the trees
    sp.seed = 22
    outs = das_llm.generate(ps, sp, use_tqdm=False)
    assert _assert_traces(outs, L) >= 8
    accepted = sum(i.draft_accepted for _, _, i in _infos(outs))
    assert 0 < accepted < sum(i.draft_proposed for _, _, i in _infos(outs))


def test_a_head_with_trace_features_scores_them(arrol_llm, prompts):
    """A head that reads the trace (w1 zero, w1f on the mean log-probability) scores each
    sample from its own features, as QualityHead does on the trainer's side."""
    from vllm_rl.arrol.head import QualityHead

    hidden = arrol_llm.arrol_info()["hidden_size"]
    head = QualityHead(hidden, width=4, inputs="trace")
    with torch.no_grad():
        head.fcf.weight.copy_(torch.tensor([[3.0, 0.0, 0.0]] * 4))
        head.fc1.bias.fill_(0.5)
        head.fc2.weight.fill_(1.0)
        head.fc2.bias.fill_(0.0)
    arrol_llm.arrol_update(head=head.export(5), cold_start=True)
    outs = arrol_llm.generate(prompts[:6], SamplingParams(
        n=2, temperature=1.0, max_tokens=40, seed=4, extra_args=rl_params(
            arrol={"l_detect": 12})), use_tqdm=False)
    arrol_llm.arrol_update(head=_head(hidden))
    scored = [i for _, _, i in _infos(outs) if i.score is not None]
    assert len(scored) >= 4
    f = torch.tensor([i.trace for i in scored])
    expect = head.score(torch.zeros(len(scored), hidden), f)
    assert torch.allclose(torch.tensor([i.score for i in scored]), expect, atol=1e-5)
    assert len({round(i.score, 6) for i in scored}) > 1
