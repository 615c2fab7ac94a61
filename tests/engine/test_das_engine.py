"""DAS in the real engine: lossless drafting, real logprobs, per-problem trees, the tree API,
and DARTS/DUET with multi-token steps.

The engine is ``vllm_rl.LLM(das=True)``: vLLM's ``custom_class`` speculative method with
the DAS proposer; vLLM's own rejection sampler decides every token.
"""
import re
import statistics

import pytest
from conftest import shortest_violations
from vllm import SamplingParams
from vllm.exceptions import VLLMValidationError

from vllm_rl import Reason, rl_params

pytestmark = pytest.mark.engine

B = 4                 # the engine's draft budget b (long class drafts 2b)
# Where greedy tokens may differ, the reference run's top-2 log-probabilities must be
# within this gap: a floating-point near-tie, not a drafting error.  The model computes
# in bf16, whose spacing is 1/16 for logits in [8, 16) and 1/8 in [16, 32); batched
# verification sums in another order, so two ulps at those magnitudes bound the flip.
NEAR_TIE = 0.25


def _greedy(problem=None, logprobs=None):
    extra = rl_params(das={"problem_id": problem, "policy": "fixed"}) if problem else None
    return SamplingParams(temperature=0.0, max_tokens=128, logprobs=logprobs, extra_args=extra)


def _agree(ref, other) -> tuple[bool, float | None]:
    """Same tokens, or the first difference is a near-tie of the reference (its gap)."""
    a, b = list(ref.token_ids), list(other.token_ids)
    j = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    if j is None:
        return a == b, None
    top = sorted(ref.logprobs[j].values(), key=lambda lp: -lp.logprob)[:2]
    assert b[j] in ref.logprobs[j], "DAS emitted a token outside the reference's top-2"
    return False, top[0].logprob - top[1].logprob


@pytest.fixture(scope="module")
def greedy_runs(das_llm, rl_llm, prompts):
    ps = prompts[:16]
    ref = das_llm.generate(ps, _greedy(logprobs=2), use_tqdm=False)
    stock = rl_llm.generate(ps, _greedy(logprobs=2), use_tqdm=False)
    first, second = [], []
    for i, p in enumerate(ps):                       # one problem id per prompt
        first.append(das_llm.generate([p], _greedy(f"greedy-{i}"), use_tqdm=False)[0])
    for i, p in enumerate(ps):
        second.append(das_llm.generate([p], _greedy(f"greedy-{i}"), use_tqdm=False)[0])
    return ref, stock, first, second


def test_greedy_tokens_identical_with_and_without_das(greedy_runs):
    ref, stock, first, second = greedy_runs
    for runs in (stock, first, second):
        identical, gaps = 0, []
        for r, o in zip(ref, runs):
            same, gap = _agree(r.outputs[0], o.outputs[0])
            identical += same
            if gap is not None:
                gaps.append(gap)
        assert all(g < NEAR_TIE for g in gaps), gaps      # every difference is a near-tie
        assert identical >= len(ref) - 2


def test_drafts_were_proposed_and_accepted(greedy_runs):
    _, _, first, second = greedy_runs
    infos = [o.outputs[0].rollout_info for o in second]
    tokens = sum(i.length for i in infos)
    accepted = sum(i.draft_accepted for i in infos)
    assert all(i.draft_proposed >= i.draft_accepted >= 0 for i in infos)
    # The second pass drafts from the first one's rollouts: almost every token is a draft.
    assert accepted >= 0.6 * tokens, (accepted, tokens)
    assert accepted > sum(o.outputs[0].rollout_info.draft_accepted for o in first)


def test_das_logprobs_equal_scoring_without_speculation(das_llm, prompts):
    ps = prompts[16:20]
    sp = SamplingParams(n=4, temperature=1.0, max_tokens=96, seed=7, logprobs=0,
                        extra_args=rl_params(das={"policy": "fixed"}))
    das_llm.generate(ps, sp, use_tqdm=False)                     # fills the trees
    outs = das_llm.generate(ps, sp, use_tqdm=False)
    assert sum(c.rollout_info.draft_accepted for o in outs for c in o.outputs) > 0
    worst = 0.0
    for out in outs:
        for c in out.outputs:
            ids = list(out.prompt_token_ids) + list(c.token_ids)
            scored = das_llm.generate({"prompt_token_ids": ids}, SamplingParams(
                max_tokens=1, prompt_logprobs=0, temperature=0), use_tqdm=False)[0]
            n = len(out.prompt_token_ids)
            for j, (t, lp) in enumerate(zip(c.token_ids, c.logprobs)):
                worst = max(worst, abs(lp[t].logprob - scored.prompt_logprobs[n + j][t].logprob))
    assert worst < 0.05, worst


def _mean_logprob(c) -> float:
    return statistics.fmean(lp[t].logprob for t, lp in zip(c.token_ids, c.logprobs))


def test_sampling_distribution_unchanged_by_das(das_llm, prompts):
    """At temperature 1 the samples follow the model with DAS as without.

    Per arm, two seeded rounds of 16 prompts x 8 samples; the statistic is a round's
    mean per-sample token log-probability (and mean length).  vLLM seeds a request's
    i-th sample with seed + i, so the rounds' seeds lie n = 8 apart: no two rounds, and
    no round and the warm-up, share a sample's seed.  Measured here over eight rounds an
    arm, round means spread with a standard deviation of 0.021 nats (5–6 tokens) with
    DAS and without, so the arms' two-round means differ by less than 0.085 (four
    standard deviations of the difference, 0.021; 24 tokens) unless the verifier is
    wrong: with the CPU temperature bug (``patches/rejection_sampler.py``) the DAS arm's
    tokens are noise, far below -1 nat per token.  Position by position, the
    chi-square test of ``test_das_async.py`` checks the law itself."""
    ps = prompts[24:40]

    def arm(das: bool, seed: int) -> tuple[float, float]:
        extra = rl_params(das={"policy": "fixed"}) if das else None
        outs = das_llm.generate(ps, SamplingParams(n=8, temperature=1.0, max_tokens=128,
                                                   seed=seed, logprobs=0, extra_args=extra),
                                use_tqdm=False)
        cs = [c for o in outs for c in o.outputs]
        if das:
            assert sum(c.rollout_info.draft_accepted for c in cs) > 0
        return statistics.fmean(map(_mean_logprob, cs)), statistics.fmean(len(c.token_ids) for c in cs)

    arm(True, 0)                                            # fills the trees
    with_das = [arm(True, 8 * r) for r in range(1, 3)]
    without = [arm(False, 8 * r) for r in range(3, 5)]
    for k, bound in ((0, 0.085), (1, 24.0)):
        diff = statistics.fmean(x[k] for x in with_das) - statistics.fmean(x[k] for x in without)
        assert abs(diff) < bound, (k, with_das, without)


def test_das_with_darts_and_duet_in_one_request(das_llm, prompts):
    ps = prompts[40:48]
    k2, grace = 30, 10
    sp = SamplingParams(n=8, temperature=1.0, max_tokens=256, seed=4, extra_args=rl_params(
        group={"size": 3}, darts={"mode": "shortest"}, das={"policy": "fixed"},
        duet={"k1": 0, "k2": k2, "grace": grace, "eps": 0.3, "pattern": "NEVER"}))
    das_llm.generate(ps, sp, use_tqdm=False)
    outs = das_llm.generate(ps, sp, use_tqdm=False)
    accepted = 0
    reasons = {i.reason for o in outs for i in (c.rollout_info for c in o.outputs)}
    assert {Reason.DARTS_CANCELLED, Reason.DUET_ABORTED} <= reasons
    for out in outs:
        infos = [c.rollout_info for c in out.outputs]
        valid = [i for i in infos if i.valid]
        if any(i.reason is Reason.DARTS_CANCELLED for i in infos):
            assert len(valid) >= 3                  # the M shortest, with multi-token steps
            assert shortest_violations(infos, 3) == []
        for info, c in zip(infos, out.outputs):
            assert info.draft_proposed is not None and info.length == len(c.token_ids)
            accepted += info.draft_accepted
            if info.reason is Reason.DUET_ABORTED:  # at the step that crossed K2 + G
                assert k2 + grace <= info.length <= k2 + grace + 2 * B
                assert info.weight == 0.0 and not info.selected
    assert accepted > 0


def test_darts_keeps_the_m_shortest_with_a_prefilled_tree(das_llm, prompts):
    """With a tree holding the problem's past rollouts, samples whose drafts are accepted
    finish in fewer steps than shorter samples that are drafted less: stopping at the
    M-th finish would select by predictability.  The exact rule keeps the M shortest."""
    ps = prompts[52:58]
    past = das_llm.generate(ps, SamplingParams(n=8, temperature=1.0, max_tokens=256, seed=9),
                            use_tqdm=False)
    for j, out in enumerate(past):
        das_llm.das_prebuild(f"stop-{j}", [c.token_ids for c in out.outputs], out.prompt_token_ids)
    sps = [SamplingParams(n=8, temperature=1.0, max_tokens=256, seed=10 + j, extra_args=rl_params(
        group={"size": 3}, darts={"mode": "shortest"},
        das={"problem_id": f"stop-{j}", "policy": "fixed"})) for j in range(len(ps))]
    outs = das_llm.generate(ps, sps, use_tqdm=False)
    stopped = 0
    for out in outs:
        infos = [c.rollout_info for c in out.outputs]
        assert shortest_violations(infos, 3) == [], infos
        assert sum(bool(i.selected) for i in infos) == 3
        stopped += any(i.reason is Reason.DARTS_CANCELLED for i in infos)
    assert stopped >= len(ps) // 2
    assert sum(c.rollout_info.draft_accepted for o in outs for c in o.outputs) > 0


def test_duet_trim_with_multi_token_steps(das_llm, prompts):
    marker, poll = r"(= \d+ ;[^=]*){3}", 4
    sp = SamplingParams(n=8, temperature=1.0, max_tokens=256, seed=3, extra_args=rl_params(
        das={"policy": "fixed"}, duet={"k1": 6, "k2": 10_000, "poll": poll, "pattern": marker}))
    das_llm.generate(prompts[48:52], sp, use_tqdm=False)
    tok = das_llm.get_tokenizer()
    trimmed = 0
    for out in das_llm.generate(prompts[48:52], sp, use_tqdm=False):
        for c in out.outputs:
            info = c.rollout_info
            if info.reason is not Reason.DUET_TRIMMED:
                continue
            trimmed += 1
            assert info.marker_pos == info.length == len(c.token_ids)
            assert re.search(marker, c.text)
            # The first poll at or after the marker saw it: at most poll + 2b tokens late.
            before = info.length - poll - 2 * B - 1
            if before >= 6:
                assert not re.search(marker, tok.decode(c.token_ids[:before]))
    assert trimmed >= 8


def test_a_problem_tree_serves_only_its_problem(das_llm, prompts):
    p = prompts[60]
    ref = das_llm.generate([p], _greedy(), use_tqdm=False)[0]
    rollout = list(ref.outputs[0].token_ids)
    assert das_llm.das_prebuild("iso-A", [rollout], ref.prompt_token_ids) == 1
    before = das_llm.das_stats()["per_problem"]
    assert before["iso-A"]["rollouts"] == 1 and "iso-B" not in before
    a = das_llm.generate([p], _greedy("iso-A"), use_tqdm=False)[0].outputs[0]
    b = das_llm.generate([p], _greedy("iso-B"), use_tqdm=False)[0].outputs[0]
    assert list(a.token_ids) == list(b.token_ids) == rollout
    acc_a, acc_b = a.rollout_info.draft_accepted, b.rollout_info.draft_accepted
    assert acc_a >= 0.6 * len(rollout) and acc_b < acc_a / 2, (acc_a, acc_b)
    after = das_llm.das_stats()["per_problem"]
    assert after["iso-A"]["accepted"] - before["iso-A"]["accepted"] == acc_a
    assert after["iso-B"]["accepted"] == acc_b and after["iso-B"]["requests"] == 1
    assert after["iso-A"]["rollouts"] == 2 and after["iso-B"]["rollouts"] == 1
    assert das_llm.das_clear("iso-A") == 1
    assert "iso-A" not in das_llm.das_stats()["per_problem"]


def test_trees_survive_weight_reload_and_sleep(das_llm, prompts):
    das_llm.generate(prompts[:2], _greedy("survive"), use_tqdm=False)
    before = das_llm.das_stats()
    das_llm.collective_rpc("reload_weights")
    das_llm.sleep(level=1)
    das_llm.wake_up()
    after = das_llm.das_stats()
    assert after["per_problem"]["survive"] == before["per_problem"]["survive"]
    assert after["stored_tokens"] == before["stored_tokens"]


def test_engine_reports_acceptance_per_verification_step(das_llm, greedy_runs):
    stats = das_llm.das_stats()
    steps = stats["per_step"]
    assert steps and all(reqs >= 1 and 0 <= acc <= prop for reqs, prop, acc in steps)
    assert len(steps) < 4096                      # the log has not wrapped: totals add up
    assert stats["accepted"] == sum(acc for _, _, acc in steps)
    assert stats["proposed"] == sum(prop for _, prop, _ in steps)
    assert stats["verifications"] == sum(reqs for reqs, _, _ in steps)
    assert 0 < stats["acceptance_rate"] <= 1 and stats["mean_accepted_per_verification"] > 0


def test_das_flags_checked_against_the_engine(das_llm, rl_llm, prompts):
    with pytest.raises(VLLMValidationError, match="das"):
        rl_llm.generate(prompts[:1], SamplingParams(max_tokens=4, extra_args=rl_params(das=True)),
                        use_tqdm=False)
    with pytest.raises(VLLMValidationError, match=r"das.budget.*int in \[0, 4\]"):
        das_llm.generate(prompts[:1], SamplingParams(
            max_tokens=4, extra_args={"vllm_rl": {"das": {"budget": 5}}}), use_tqdm=False)
    with pytest.raises(VLLMValidationError, match="das.policy"):
        das_llm.generate(prompts[:1], SamplingParams(
            max_tokens=4, extra_args={"vllm_rl": {"das": {"policy": "greedy"}}}), use_tqdm=False)
    out = das_llm.generate(prompts[:1], SamplingParams(max_tokens=4, extra_args=rl_params(
        das={"budget": 2})), use_tqdm=False)[0]
    assert out.outputs[0].rollout_info.draft_proposed is not None


def test_class_policy_drafts_for_long_requests_only(das_llm, prompts):
    """Sec. 4.2.3: after a round, T_short is that round's N_fwd; a problem whose history is
    short starts short (budget 0) and is promoted only once its length makes "short"
    unlikely; with no history a request starts medium (budget b)."""
    ps = prompts[52:60]

    def sp(seed):
        return [SamplingParams(n=4, temperature=1.0, max_tokens=256, seed=seed,
                               extra_args=rl_params(das={"problem_id": f"cls-{i}",
                                                         "policy": "class"}))
                for i in range(len(ps))]

    first = das_llm.generate(ps, sp(31), use_tqdm=False)       # no history: all medium
    assert all(c.rollout_info.draft_proposed > 0 for o in first for c in o.outputs
               if c.rollout_info.length > 2)
    n_fwd = das_llm.das_stats()["n_fwd_recent_rounds"][-1]
    assert 0 < n_fwd <= 256
    second = [c.rollout_info for o in das_llm.generate(ps, sp(32), use_tqdm=False)
              for c in o.outputs]
    undrafted = [i for i in second if i.draft_proposed == 0]
    drafted = [i for i in second if i.draft_proposed > 0]
    assert undrafted and drafted                               # classes differ by request
    assert max(i.length for i in undrafted) < max(i.length for i in drafted)


def test_optimal_policy_sets_budgets_per_request(das_llm, prompts):
    """Eq. 7 over the running requests: budgets differ by request, tokens stay the model's."""
    ps = prompts[56:60]
    sp = SamplingParams(n=4, temperature=1.0, max_tokens=128, seed=41,
                        extra_args=rl_params(das={"policy": "optimal", "problem_id": "opt"}))
    das_llm.generate(ps, sp, use_tqdm=False)
    infos = [c.rollout_info for o in das_llm.generate(ps, sp, use_tqdm=False)
             for c in o.outputs]
    assert all(0 <= i.draft_accepted <= i.draft_proposed for i in infos)
    rates = {round(i.draft_proposed / i.length, 2) for i in infos if i.length > 8}
    assert len(rates) > 1


# ------------------------------------------ the phase-aware cap (DASConfig batch_cap="phase")


@pytest.fixture(scope="module")
def phase_llm():
    """A DAS engine with the phase-aware cap planning on the H100 table (so its decisions
    do not depend on this machine's step times)."""
    from conftest import MAX_MODEL_LEN, shutdown

    from vllm_rl import LLM
    from vllm_rl.task import MODEL_PATH

    llm = LLM(MODEL_PATH, seed=0, max_model_len=MAX_MODEL_LEN, das={"batch_cap": "phase"},
              cost="h100:qwen3-8b")
    yield llm
    shutdown(llm)


def test_phase_cap_drafts_what_the_rule_says_and_vllm_verifies_it(phase_llm, prompts):
    """Every step, the drafter's draft lengths are das.caps.phase_budgets' answer for the
    step's batch, mean context, acceptance estimates and the tree's draft lengths; vLLM
    verifies exactly those drafts in the next step; the tail drafts more per request than
    the bulk."""
    from vllm_rl.das.batch_caps import phase_budgets
    from vllm_rl.cost import load_cost

    ps = prompts[:16]
    for seed in (51, 52):                      # the first round grows the trees
        sp = [SamplingParams(n=8, temperature=1.0, max_tokens=96, seed=seed + i,
                             extra_args=rl_params(das={"problem_id": f"phase-{i}"}))
              for i in range(len(ps))]
        outs = phase_llm.generate(ps, sp, use_tqdm=False)
    infos = [c.rollout_info for o in outs for c in o.outputs]
    assert sum(i.draft_accepted for i in infos) > 0
    log = phase_llm.collective_rpc("das_phase")[0]
    table = load_cost("h100:qwen3-8b")
    decided = 0
    for d in log:
        if d["probe"]:
            continue
        curve = [table.uniform_ms(d["batch"], 1 + k, d["context"]) for k in range(2 * B + 1)]
        assert list(d["k"]) == phase_budgets(curve.__getitem__, d["batch"], list(d["q"]),
                                             list(d["caps"]))
        decided += 1
    assert decided > 20
    pairs = [(a, b) for a, b in zip(log, log[1:]) if b["step"] == a["step"] + 1]
    assert len(pairs) > 20
    for a, b in pairs:
        assert b["verified"] == sum(a["k"]), (a, b)

    def per_row(ds):
        return sum(sum(d["k"]) for d in ds) / max(1, sum(len(d["k"]) for d in ds))

    bulk = [d for d in log if d["batch"] >= 64 and not d["probe"]]
    tail = [d for d in log if d["batch"] <= 8 and not d["probe"]]
    assert bulk and tail and per_row(tail) > per_row(bulk)


def test_phase_cap_keeps_greedy_tokens(phase_llm, prompts):
    ps = prompts[16:24]
    ref = phase_llm.generate(ps, _greedy(logprobs=2), use_tqdm=False)
    for _ in range(2):                         # the second run drafts from the first
        runs = [phase_llm.generate([p], _greedy(f"phase-greedy-{i}"), use_tqdm=False)[0]
                for i, p in enumerate(ps)]
    drafted = 0
    for r, o in zip(ref, runs):
        same, gap = _agree(r.outputs[0], o.outputs[0])
        assert same or gap <= NEAR_TIE
        drafted += o.outputs[0].rollout_info.draft_accepted
    assert drafted > 0
