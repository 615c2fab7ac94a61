"""The two kits: each selected by one name, the reasoning kit's teacher in its regime."""
import random
import statistics

import pytest

from vllm_rl.task import reasoning
from vllm_rl.task.kits import KITS, kit
from vllm_rl.task.problems import extract_answer, reward


def test_each_kit_by_one_name():
    assert set(KITS) == {"arith", "reasoning"}
    assert kit().name == "arith" and kit("reasoning").max_tokens >= 1024
    with pytest.raises(ValueError, match="the kits are arith, reasoning"):
        kit("maths")
    for k in KITS.values():
        assert (k.model_path / "config.json").is_file(), k.name
        assert (k.model_path / "model.safetensors").stat().st_size < 20 << 20


def test_kits_prompt_sets_are_disjoint_and_seeded():
    r = kit("reasoning")
    held, train = r.heldout_problems(64), r.train_problems(512)
    assert held == r.heldout_problems(64) and not set(held) & set(train)
    assert all(reasoning.OPS[0] <= len(p.ops) <= reasoning.OPS[1] for p in held)
    out = r.outside_prompts(3, 16, pool=512)
    assert not set(out) & {p.prompt for p in train}


def test_reasoning_teacher_answers_early_then_checks():
    rng, problems = random.Random(0), kit("reasoning").train_problems(200)
    traces = [reasoning.teacher_trace(rng.choice(problems), rng) for _ in range(400)]
    words = [t.split() for t, _ in traces]
    first = [w.index("\\boxed{") for w in words if "\\boxed{" in w]
    # most traces answer, early, and keep writing after the answer
    assert len(first) > 0.9 * len(traces)
    assert statistics.median(first) < 100
    assert statistics.fmean(len(w) - f for w, f in zip(words, first)) > 50
    # a share runs into the limit, with or without an answer
    assert 0.03 < statistics.fmean(not ends for _, ends in traces) < 0.2
    assert all(len(w) > reasoning.RESPONSE_LIMIT for w, (_, ends) in zip(words, traces)
               if not ends)


def test_reasoning_traces_are_verifiable_and_mixed():
    rng, problems = random.Random(1), kit("reasoning").train_problems(200)
    rewards = []
    for _ in range(300):
        p = rng.choice(problems)
        text, ends = reasoning.teacher_trace(p, rng)
        if ends:
            assert extract_answer(text) is not None
            rewards.append(reward(p.prompt, text))
    assert 0.4 < statistics.fmean(rewards) < 0.9
