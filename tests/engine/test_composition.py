"""The composition rule on real engine records: who may remove what from one group.

* inside a DARTS group DUET's gate is DARTS's length cap: no eps-keep, an aborted sample
  is an unselected one;
* inside a DARTS group ARRoL's keep rate applies to the redundant M' - M and a prune that
  would leave fewer than M selectable samples is overruled (``floor``);
* DUET's K1/K2 are refit from natural lengths with cut-short samples censored;
* the marks give each paper's estimator what it needs (DUET's baseline over all).
"""
from __future__ import annotations

import pytest
from vllm import SamplingParams

from vllm_rl import Reason, rl_params
from vllm_rl.arrol.rule import BINS, composed_kappa
from vllm_rl.duet.rule import km_quantile, seeded_coin
from vllm_rl.integrations.common.marks import training_marks

NEVER = "ZZZ-never"          # a DUET pattern the embedded task never writes


def _records(outs):
    return [[c.rollout_info for c in o.outputs] for o in outs]


def test_duet_gate_inside_a_darts_group_keeps_its_eps(rl_llm, prompts):
    """Composition rule: DUET keeps its eps inside a DARTS group.  eps = 1 keeps every
    gated sample there as outside it (weight 1, in DARTS's pool); with eps = 0.5 the coin
    aborts some (weight 0, never selected) and keeps the others with weight 2, outside
    DARTS's pool: always selected, beside DARTS's M."""
    duet = {"pattern": NEVER, "k1": 8, "k2": 24, "grace": 8, "eps": 1.0}

    def params(d):
        return SamplingParams(n=8, temperature=1.0, max_tokens=64, seed=3, extra_args=rl_params(
            group={"size": 4}, darts={"mode": "dual_end", "k": 3}, duet=d))

    infos = [i for g in _records(rl_llm.generate(prompts[:6], params(duet), use_tqdm=False))
             for i in g]
    assert not any(i.reason is Reason.DUET_ABORTED or i.eps_kept for i in infos)
    assert any(i.keep_prob == 1.0 and i.length > 32 and i.weight == 1.0 for i in infos)
    aborted = kept = 0
    for group in _records(rl_llm.generate(prompts[:6], params({**duet, "eps": 0.5}),
                                          use_tqdm=False)):
        assert sum(1 for i in group if i.selection in ("short", "long")) <= 4
        for i in group:
            if i.reason is Reason.DUET_ABORTED:
                aborted += 1
                assert i.weight == 0.0 and not i.selected and i.length == 32
            elif i.eps_kept:
                kept += 1
                assert i.selected and i.selection == "eps_kept" and i.weight == 2.0
            else:
                assert i.weight in (0.0, 1.0) and i.keep_prob == 1.0
    assert aborted > 0 and kept > 0


def _flat(delta: float, auc: float | None = None) -> dict:
    d = {"pos": [0] * BINS, "neg": [0] * BINS, "alpha": 1.0, "prior": 0.5,
         "delta": delta, "bins": BINS}
    return d if auc is None else {**d, "auc": auc}


def test_arrol_inside_a_darts_group_keeps_m_and_composes_kappa(das_llm, prompts):
    """ARRoL acts on the redundancy: p' = M/M' + (1 - M/M') p, so a flat calibration
    (p = κ) gives κ' = M/M' + κ(1 - M/M'); with every p at p_min = 0 each sample is
    pruned with probability 1 - M/M' (ARRoL's share, M' - M in expectation), no group
    drops below M, and every sample scored at that floor says so."""
    m, n, L = 4, 8, 12
    flags = dict(group={"size": m}, darts={"mode": "dual_end", "k": m - 1},
                 arrol={"l_detect": L})
    das_llm.arrol_update(calibration=_flat(0.0, auc=0.77))      # the AUC that opened it
    outs = das_llm.generate(prompts[:4], SamplingParams(
        n=n, temperature=1.0, max_tokens=64, seed=8, extra_args=rl_params(**flags)),
        use_tqdm=False)
    kappa = composed_kappa(0.5, m, n)
    assert kappa == pytest.approx(0.75)
    scored = [i for g in _records(outs) for i in g if i.score is not None]
    assert scored and all(i.p == pytest.approx(kappa) and i.head_auc == 0.77 for i in scored)
    das_llm.arrol_update(calibration=_flat(-1.0))                 # p = p_min = 0 for all
    floor_flags = dict(flags, arrol={"l_detect": L, "p_min": 0.0})
    try:
        outs = das_llm.generate(prompts[4:20], SamplingParams(
            n=n, temperature=1.0, max_tokens=64, seed=9,
            extra_args=rl_params(**floor_flags)), use_tqdm=False)
        alone = das_llm.generate(prompts[4:12], SamplingParams(
            n=n, temperature=1.0, max_tokens=64, seed=9, extra_args=rl_params(
                arrol={"l_detect": L, "p_min": 0.0})), use_tqdm=False)
    finally:
        das_llm.arrol_update(cold_start=True)
    floors = 0
    for group in _records(outs):
        left = [i for i in group if i.reason is not Reason.ARROL_PRUNED]
        assert len(left) >= m and len(group) - len(left) <= n - m
        for i in group:
            if i.score is not None:
                assert i.p == pytest.approx(m / n)               # p' = s + (1 - s) * 0
            if i.floor:
                floors += 1
                assert not i.pruned and i.reason is not Reason.ARROL_PRUNED
    assert floors > 0
    pruned_alone = [i for g in _records(alone) for i in g if i.reason is Reason.ARROL_PRUNED]
    scored_alone = [i for g in _records(alone) for i in g if i.score is not None]
    assert len(pruned_alone) == len(scored_alone) > 0          # p = 0: no floor without DARTS
    assert not any(i.floor for g in _records(alone) for i in g)


def test_duet_thresholds_refit_from_natural_lengths(rl_llm, prompts):
    """Ten rounds of the same seeded single requests (marker kind "qa", which this task
    never writes: no trims), K1/K2 left to the engine: the eleventh round runs with the
    weighted Kaplan-Meier p30/p80 of what the gate let through, exactly as the rule
    states: ends below the gate are events, eps-kept ones weigh 1/eps (an end, or
    censored at max_tokens), aborted ones leave."""
    max_tokens, eps, grace = 128, 0.25, 8
    ps = prompts[:16]
    seeds = [500 + i for i in range(len(ps))]
    natural = rl_llm.generate(ps, [SamplingParams(temperature=1.0, max_tokens=max_tokens,
                                                  seed=s) for s in seeds], use_tqdm=False)
    duet = {"marker": "qa", "grace": grace, "eps": eps}
    params = [SamplingParams(temperature=1.0, max_tokens=max_tokens, seed=s,
                             extra_args=rl_params(duet=duet)) for s in seeds]
    for _ in range(10):
        first = rl_llm.generate(ps, params, use_tqdm=False)
    cold = [o.outputs[0].rollout_info for o in first]
    k1_cold, k2_cold = int(0.3 * max_tokens), int(0.7 * max_tokens)
    assert all((i.k1, i.k2) == (k1_cold, k2_cold) for i in cold)
    gate = k2_cold + grace
    expected = []
    for o, s in zip(natural, seeds):
        c = o.outputs[0]
        length, ended = len(c.token_ids), c.finish_reason == "stop"
        if length <= gate:                        # ended before the gate could act
            expected.append((length, ended, 1.0))
        elif seeded_coin(s, o.prompt_token_ids, "seeded") < eps:
            expected.append((length, ended, 1 / eps))
    refit = [o.outputs[0].rollout_info for o in rl_llm.generate(ps, params, use_tqdm=False)]
    k1 = km_quantile(expected * 10, 0.30)
    k2 = max(k1, km_quantile(expected * 10, 0.80))
    assert all((i.k1, i.k2) == (k1, k2) for i in refit)
    assert k1 < gate and k1 <= k2


def test_marks_on_real_records_give_duet_its_baseline(rl_llm, prompts):
    """DUET alone: aborted samples are in the group baseline (Alg. A.10 l.38), out of the
    loss; eps-kept ones weigh 1/eps."""
    flags = {"duet": {"pattern": NEVER, "k1": 8, "k2": 24, "grace": 8, "eps": 0.5}}
    outs = rl_llm.generate(prompts[:6], SamplingParams(
        n=4, temperature=1.0, max_tokens=64, seed=21, extra_args=rl_params(**flags)),
        use_tqdm=False)
    seen = set()
    for group in _records(outs):
        for info, mark in zip(group, training_marks(group, [flags] * len(group))):
            assert mark.baseline
            if info.reason is Reason.DUET_ABORTED:
                assert not mark.keep and mark.weight == 0.0
            elif info.keep_prob == 0.5:
                assert mark.keep and mark.weight == 2.0 and mark.eps_kept
            seen.add(info.reason)
    assert Reason.DUET_ABORTED in seen
