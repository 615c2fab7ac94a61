"""DAS under vLLM's asynchronous scheduling (``patches/model_runner/das_async.py``), against the same
drafter scheduled synchronously.

The session's ``das_llm`` schedules asynchronously, as a DAS engine does on a GPU (on
this CPU through ``vllm_rl_async_cpu``); this module starts the same engine with
``das={"async_scheduling": False}``.  The async drafter drafts step n + 1 while step n
runs, on a guess of step n's outcome (``DASConfig.lookahead``); the sync one from step
n's tokens.  The drafts differ, the tokens do not: greedy, every token is the same and
every logprob within bf16's rounding of another batch shape; sampled, the output distribution is the same (a chi-square test over many seeded
samples, as vLLM tests its rejection sampler against its target distribution).
"""
from collections import Counter

import pytest
import torch
from vllm import SamplingParams

from vllm_rl import SCHEDULER_CLS, SYNC_SCHEDULER_CLS, rl_params

pytestmark = pytest.mark.engine


def _requests(prompts, tag: str, seed: int, temperature: float):
    return [SamplingParams(n=1 if temperature == 0 else 4, temperature=temperature,
                           max_tokens=96, seed=seed + i,
                           logprobs=2 if temperature == 0 else 0,   # greedy: the gap
                           extra_args=rl_params(das={"problem_id": f"{tag}-{i}",
                                                     "policy": "fixed"}))
            for i in range(len(prompts))]


def _run(llm, prompts, tag: str, temperature: float):
    """Two passes over the prompts: the second drafts from the first one's rollouts."""
    out = []
    for seed in (100, 200):
        out += llm.generate(prompts, _requests(prompts, tag, seed, temperature),
                            use_tqdm=False)
    stats = llm.das_stats()["per_problem"]
    return out, {k: (v["drafted"], v["accepted"]) for k, v in stats.items()
                 if k.startswith(tag + "-")}


def _name(cls) -> str:
    return cls if isinstance(cls, str) else f"{cls.__module__}.{cls.__qualname__}"


def test_engines_schedule_as_configured(das_llm, sync_das_llm):
    a = das_llm.llm_engine.vllm_config.scheduler_config
    s = sync_das_llm.llm_engine.vllm_config.scheduler_config
    assert a.async_scheduling and _name(a.scheduler_cls) == SCHEDULER_CLS
    assert not s.async_scheduling and _name(s.scheduler_cls) == SYNC_SCHEDULER_CLS


def test_async_lookahead_gives_the_same_tokens_as_sync(das_llm, sync_das_llm, prompts):
    """Greedy: the lookahead's drafts (made on guesses) and the synchronous drafter's
    (made on the tokens) give every token alike (logprobs within bf16's rounding); both draft, and each
    record's counts sum to its problem's."""
    ps = prompts[:6]
    tag = "async-eq"
    a_out, a_stats = _run(das_llm, ps, tag, 0.0)
    s_out, s_stats = _run(sync_das_llm, ps, tag, 0.0)
    _assert_same_greedy(a_out, s_out)
    for out, stats in ((a_out, a_stats), (s_out, s_stats)):
        _assert_drafted(out, stats, len(ps))


# The same token's logprob computed in another batch shape (other drafts verified beside
# it, another step's rows) rounds otherwise in bf16 on the CPU: logprobs agree within
# the dtype's tolerance, as the suite's other cross-shape checks take them
# (test_das_engine.py), never exactly.  A greedy choice may flip only where the
# reference's two best tokens were this close (test_das_engine.NEAR_TIE).
LOGPROB_TOL = 0.05
NEAR_TIE = 0.25
FLIPS = 2           # of the 12 greedy samples, at most this many flip at a near-tie


def _assert_same_greedy(outs, refs):
    """Every token, end reason and length as the reference's, and every logprob within
    :data:`LOGPROB_TOL`; a sample whose greedy choice flipped at a near-tie of the
    reference is compared up to the flip."""
    flips = 0
    for a, s in zip(outs, refs, strict=True):
        for x, y in zip(a.outputs, s.outputs, strict=True):
            xs, ys = list(x.token_ids), list(y.token_ids)
            j = next((i for i, (p, q) in enumerate(zip(xs, ys)) if p != q), None)
            if j is None:
                assert xs == ys
                ra, rs = x.rollout_info, y.rollout_info
                assert (ra.reason, ra.length) == (rs.reason, rs.length)
            else:
                best, second = sorted(lp.logprob for lp in y.logprobs[j].values())[::-1][:2]
                assert best - second < NEAR_TIE, (j, best, second)
                flips += 1
                xs = xs[:j]
            assert [x.logprobs[i][t].logprob for i, t in enumerate(xs)] == pytest.approx(
                [y.logprobs[i][t].logprob for i, t in enumerate(xs)], abs=LOGPROB_TOL)
    assert flips <= FLIPS, flips


def _assert_drafted(out, stats, problems: int):
    """Drafts verified and accepted, and the records' counts sum to each problem's."""
    drafted = sum(c.rollout_info.draft_proposed for o in out for c in o.outputs)
    accepted = sum(c.rollout_info.draft_accepted for o in out for c in o.outputs)
    assert accepted > 0 and drafted >= accepted and len(stats) == problems
    assert (drafted, accepted) == tuple(map(sum, zip(*stats.values())))


def _chi2_p(a: Counter, b: Counter, min_count: int = 10) -> float:
    """Two-sample chi-square test of homogeneity (categories with fewer than
    ``min_count`` pooled samples merged): the p-value of "the same distribution"."""
    keys = [k for k in a.keys() | b.keys() if a[k] + b[k] >= min_count]
    rest = (sum(a.values()) - sum(a[k] for k in keys), sum(b.values()) - sum(b[k] for k in keys))
    table = torch.tensor([[a[k] for k in keys] + [rest[0]], [b[k] for k in keys] + [rest[1]]],
                         dtype=torch.float64)
    table = table[:, table.sum(0) > 0]
    expected = table.sum(1, keepdim=True) * table.sum(0, keepdim=True) / table.sum()
    stat = ((table - expected) ** 2 / expected).sum()
    dof = table.shape[1] - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2.0, dtype=torch.float64),
                                         stat / 2))


def test_lookahead_drafting_samples_the_models_distribution(das_llm, prompts):
    """Sampled at temperature 1, seeded: the tokens of requests that draft (the
    lookahead, trees built from a first pass) against requests on the same engine that do
    not.  At every position the drafts reach, the two samples are one distribution
    (chi-square, p > 1e-4 at each of 7 positions: a false alarm about once in 1,400
    runs); drafting did happen.  Eight tokens: a batch's decision to draft reaches the
    async scheduler's placeholders a step or two after its first decode step, so four
    tokens left room for drafts on some runs and none on others."""
    prompt, positions, n = prompts[20], 8, 64

    def params(seed, das):
        flags = rl_params(das={"problem_id": "lossless", "policy": "fixed"}) if das else None
        return SamplingParams(n=n, temperature=1.0, max_tokens=positions, seed=seed,
                              extra_args=flags)

    das_llm.generate([prompt] * 2, [params(s, True) for s in (1, 2)], use_tqdm=False)  # trees
    # vLLM seeds a request's i-th sample seed + i: requests n apart share no sample seed,
    # so the 2 × 512 samples are independent draws
    drafted = das_llm.generate([prompt] * 8, [params(10_000 + n * s, True) for s in range(8)],
                               use_tqdm=False)
    plain = das_llm.generate([prompt] * 8, [params(20_000 + n * s, False) for s in range(8)],
                             use_tqdm=False)
    samples = {"das": [c for o in drafted for c in o.outputs],
               "plain": [c for o in plain for c in o.outputs]}
    assert sum(c.rollout_info.draft_accepted for c in samples["das"]) > n
    for pos in range(1, positions):
        # the joint law of the tokens up to pos: a drafted token changed anywhere shows
        counts = {k: Counter(tuple(c.token_ids[:pos + 1]) for c in v
                             if len(c.token_ids) > pos) for k, v in samples.items()}
        assert _chi2_p(counts["das"], counts["plain"]) > 1e-4, pos


@pytest.mark.parametrize("llm", ["das_llm", "sync_das_llm"])
def test_records_count_the_drafts_the_drafter_made(llm, prompts, request):
    """At temperature 1, with siblings drafting from one tree: per problem, the records'
    draft tokens and accepted tokens are the drafter's own counts."""
    engine = request.getfixturevalue(llm)
    ps = prompts[6:12]
    tag = f"records-{llm}"
    out, stats = _run(engine, ps, tag, 1.0)
    per = {}
    for o, p in zip(out, [f"{tag}-{i}" for i in range(len(ps))] * 2):
        for c in o.outputs:
            d, a = per.get(p, (0, 0))
            per[p] = (d + c.rollout_info.draft_proposed, a + c.rollout_info.draft_accepted)
    assert {p: d for p, (d, _) in per.items()} == {p: d for p, (d, _) in stats.items()}
    for o in out:             # a round is a step verified on at least one draft token
        for c in o.outputs:
            i = c.rollout_info
            assert (i.draft_rounds == 0) == (i.draft_proposed == 0)
            assert i.draft_rounds <= min(i.draft_proposed, i.length)
    # the drafter counts accepted drafts past a stop token too; the records do not
    assert all(per[p][1] <= stats[p][1] for p in per)
    assert sum(a for _, a in per.values()) > 0


@pytest.fixture(scope="module")
def capped_llm():
    """A DAS engine whose batch cap has drafting off at every batch size (the linear cap
    with ``off_batch=0``), scheduled asynchronously."""
    from conftest import MAX_MODEL_LEN, shutdown

    from vllm_rl import LLM
    from vllm_rl.settings import CPU_ASYNC_KEY
    from vllm_rl.task import MODEL_PATH

    llm = LLM(MODEL_PATH, seed=0, max_model_len=MAX_MODEL_LEN,
              das={"batch_cap": "linear", "full_batch": 0, "off_batch": 0},
              additional_config={CPU_ASYNC_KEY: True})
    yield llm
    shutdown(llm)


def test_switched_off_drafting_is_in_the_records_and_force_overrides_it(capped_llm, prompts):
    """Where DAS's batch cap has drafting off, no sample drafts and each record counts the
    engine steps of its life without drafts (at least one per token it generated);
    ``das.force`` drafts anyway, and the tokens are the same (greedy: lossless)."""
    ps = prompts[:6]

    def run(tag, force):
        out = []
        for seed in (300, 400):         # the second pass drafts from the first's rollouts
            sp = [SamplingParams(n=1, temperature=0.0, max_tokens=64, seed=seed + i,
                                 extra_args=rl_params(das={"problem_id": f"{tag}-{i}",
                                                           "policy": "fixed",
                                                           "force": force}))
                  for i in range(len(ps))]
            out += capped_llm.generate(ps, sp, use_tqdm=False)
        return [c for o in out for c in o.outputs]

    off, forced = run("capped", False), run("forced", True)
    for c in off:
        i = c.rollout_info
        assert (i.draft_proposed, i.draft_rounds) == (0, 0)
        assert i.draft_off_steps >= i.length
    assert sum(c.rollout_info.draft_rounds for c in forced) > 0
    assert sum(c.rollout_info.draft_accepted for c in forced) > 0
    assert [list(c.token_ids) for c in forced] == [list(c.token_ids) for c in off]


@pytest.fixture(scope="module")
def default_das_llm():
    """A DAS engine on the engine's defaults (``das=True``: the confidence cap, the trees'
    prior λ = 0.5), scheduled asynchronously, priced on the H100 table (so its drafts do
    not depend on this machine's step times)."""
    from conftest import MAX_MODEL_LEN, shutdown

    from vllm_rl import LLM
    from vllm_rl.settings import CPU_ASYNC_KEY
    from vllm_rl.task import MODEL_PATH

    llm = LLM(MODEL_PATH, seed=0, max_model_len=MAX_MODEL_LEN, das=True,
              cost="h100:qwen3-8b", additional_config={CPU_ASYNC_KEY: True})
    yield llm
    shutdown(llm)


def test_the_default_cap_drafts_and_keeps_the_tokens(default_das_llm, sync_das_llm, prompts):
    """The confidence cap (the default) under the lookahead: every greedy token as the
    synchronous linear-capped engine's (logprobs within bf16's rounding), drafts verified and accepted, and
    each step decided by the cap, none of them off on these small batches."""
    ps = prompts[:6]
    tag = "default-cap"
    d_out, d_stats = _run(default_das_llm, ps, tag, 0.0)
    s_out, _ = _run(sync_das_llm, ps, tag, 0.0)
    _assert_same_greedy(d_out, s_out)
    _assert_drafted(d_out, d_stats, len(ps))
    caps = default_das_llm.das_stats()["cost_cap"]
    assert caps["decisions"] > 0 and caps["off"] == 0
