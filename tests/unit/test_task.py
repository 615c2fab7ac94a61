"""The task kit and the embedded model: verifier, prompt sets, model files, and its behaviour."""
import json
import random

import pytest

from vllm_rl.task import MODEL_PATH, extract_answer, heldout_problems, reward, train_problems
from vllm_rl.task.problems import parse_prompt, teacher_trace


def test_verifier_parses_the_last_closed_box():
    p = heldout_problems(1)[0]
    right, wrong = p.answer, p.answer + 1
    assert reward(p.prompt, f"... so \\boxed{{ {right} }}") == 1.0
    assert reward(p.prompt, f"\\boxed{{{right}}}") == 1.0
    assert reward(p.prompt, f"\\boxed{{ {wrong} }} hmm again \\boxed{{ {right} }}") == 1.0
    assert reward(p.prompt, f"\\boxed{{ {right} }} wait \\boxed{{ {wrong} }}") == 0.0
    assert reward(p.prompt, f"so \\boxed{{ {right}") == 0.0          # unclosed
    assert reward(p.prompt, "no answer at all") == 0.0
    assert extract_answer("\\boxed{ -3 }") == -3


def test_prompt_sets_are_fixed_and_disjoint():
    held, train = heldout_problems(64), train_problems(2048)
    assert held == heldout_problems(64)
    assert not set(held) & set(train)
    assert all(parse_prompt(p.prompt) == p for p in held[:32])


def test_outside_prompts_are_seeded_and_outside_training_and_heldout():
    from vllm_rl.task.problems import outside_prompts

    got = outside_prompts(7, 32, pool=512)
    assert got == outside_prompts(7, 32, pool=512) != outside_prompts(8, 32, pool=512)
    inside = {p.prompt for p in train_problems(512)} | {p.prompt for p in heldout_problems(256)}
    assert len(set(got)) == 32 and not set(got) & inside


def test_bench_step_names_its_history_and_prompts():
    from vllm_rl.bench.points import rests_on
    from vllm_rl.bench.step.command import parser

    args = parser().parse_args(["--history", "4", "--prompt-seed", "9", "--m", "8"])
    assert (args.history, args.prompt_seed) == (4, 9)
    assert "32 rollouts per problem" in rests_on(args) and "seed 9" in rests_on(args)
    assert "fixed held-out" in rests_on(parser().parse_args([]))
    with pytest.raises(SystemExit):
        parser().parse_args(["--history", "0"])


def test_points_merge_keeps_what_the_merged_runs_rest_on(tmp_path, capsys):
    """A merge's table and picture name the merged runs' kit and history, not the merging
    command's defaults (the committed reasoning-kit points: --task reasoning)."""
    from pathlib import Path

    from vllm_rl.bench.points import main

    runs = Path(__file__).resolve().parents[2] / "docs/results/reasoning/points-16x8.json"
    main(["--merge", str(runs), "--out", str(tmp_path)])
    args = json.loads((tmp_path / "points.json").read_text())["args"]
    assert args["task"] == "reasoning" and args["max_tokens"] == 1024
    assert "the reasoning kit's fixed held-out prompts" in capsys.readouterr().out
    assert (tmp_path / "points.png").stat().st_size > 0


def test_a_partial_step_is_credited_with_the_groups_it_completes():
    from vllm_rl.bench.step.report import delivered_speedup

    stock = {"groups": 16, "projected_ms": 100.0}
    assert delivered_speedup(stock, {"groups": 16, "projected_ms": 50.0}, "projected_ms") == 2.0
    # half the time, half the groups: no faster at delivering groups
    assert delivered_speedup(stock, {"groups": 8, "projected_ms": 50.0}, "projected_ms") == 1.0
    # a summary from before groups were counted: the time ratio
    assert delivered_speedup({"projected_ms": 100.0}, {"projected_ms": 50.0},
                             "projected_ms") == 2.0


def test_teacher_traces_are_verifiable():
    rng = random.Random(0)
    p = heldout_problems(1)[0]
    rewards = [reward(p.prompt, teacher_trace(p, rng)[0]) for _ in range(200)]
    assert 0 < sum(rewards) < 200


def test_model_is_shipped_small_and_offline():
    names = {f.name for f in MODEL_PATH.iterdir()}
    assert {"config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors"} <= names
    assert (MODEL_PATH / "model.safetensors").stat().st_size <= 20 * 2**20
    cfg = json.loads((MODEL_PATH / "config.json").read_text())
    assert cfg["model_type"] in ("qwen2", "qwen3") and cfg["head_dim"] == 64


def test_tokenizer_round_trips_task_text():
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(MODEL_PATH)
    p = heldout_problems(1)[0]
    text = p.prompt + " " + teacher_trace(p, random.Random(1))[0]
    assert tok.decode(tok.encode(text)) == text


@pytest.mark.engine
def test_generation_with_n_samples(rl_llm, prompts):
    from vllm import SamplingParams

    outs = rl_llm.generate(prompts[:4], SamplingParams(n=5, temperature=1.0, max_tokens=256,
                                                       seed=0), use_tqdm=False)
    assert [len(o.outputs) for o in outs] == [5] * 4
    texts = [c.text for o in outs for c in o.outputs]
    assert len(set(texts)) > 4 and all(t.strip() for t in texts)
    assert any(reward(p, c.text) == 1.0 for p, o in zip(prompts, outs) for c in o.outputs)


@pytest.mark.engine
def test_policy_behaves_like_an_rl_policy(rl_llm, prompts):
    """The foundation issue's statistics, on a 32-prompt sample (behaviour, not timing)."""
    from vllm_rl.task.report import MAX_TOKENS, compute, sample

    subset = prompts[:32]
    report = compute(subset, sample(rl_llm, subset, 16, MAX_TOKENS, seed=0), MAX_TOKENS)
    failed = [name for name, ok in report.checks().items() if not ok]
    assert not failed, (failed, report)
