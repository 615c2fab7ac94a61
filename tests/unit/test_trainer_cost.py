"""The trainer's cost model (vllm_rl.cost.trainer), the bench's time axes
(vllm_rl.bench.train.budget) and its per-step checkpoints (vllm_rl.bench.train.resume):
pure Python, no engine; one CPU run of the trainer measurer at a tiny shape."""
from __future__ import annotations

import json
import pickle

import pytest

from vllm_rl.bench.train import budget as train_budget
from vllm_rl.bench.train import resume as train_resume
from vllm_rl.cost.shapes import SHAPES, Shape
from vllm_rl.cost.trainer import (GPUS, MODEL, TOPOLOGIES, TrainedBatch, TrainerCost,
                                  TrainerTime, end_to_end, topology)

HEADLINE = next(iter(TOPOLOGIES))


def test_shapes_count_the_published_parameters():
    assert SHAPES["qwen3-8b"].params == pytest.approx(8.19e9, rel=0.01)     # Qwen3-8B
    assert SHAPES["qwen3-1.7b"].params == pytest.approx(1.72e9, rel=0.01)   # tied head
    assert SHAPES["qwen3-1.7b"].matmul_params == SHAPES["qwen3-1.7b"].params
    with pytest.raises(ValueError, match="tied"):
        Shape(1, 8, 2, 1, 4, 16, 32, tied=1)


def test_padding_as_the_trainer_pads():
    b = TrainedBatch.of([3, 5], [10, 2])
    assert b.rows == 2 and b.tokens == 20
    assert b.sequences("batch") == [15, 15] and b.sequences("packed") == [13, 7]
    with pytest.raises(ValueError):
        b.sequences("nope")
    with pytest.raises(ValueError, match="one entry per row"):
        TrainedBatch.of([1], [1, 2])
    with pytest.raises(ValueError, match="completion_lengths"):
        TrainedBatch.of([1], [-1])


def test_the_flops_model_at_the_headline_topology():
    """8 N T (one log-prob pass 2NT, forward + recomputed forward + backward 8NT = 10 NT
    in all) at 40% of an H100's 989 TFLOP/s, plus the attention term."""
    cost = TrainerCost.load(HEADLINE)
    batch = TrainedBatch.of([100] * 4, [412] * 4)
    t = cost.step(batch)
    n, tokens = SHAPES["qwen3-1.7b"].matmul_params, 4 * 512
    linear = 2 * n * tokens / (GPUS["h100"].peak_tflops * 1e12 * MODEL.mfu)
    assert t.logprob_s == pytest.approx(linear, rel=0.05)        # attention: a few percent
    assert t.logprob_s > linear
    assert t.train_s == pytest.approx(4 * t.logprob_s)
    assert 0 < t.optimizer_s < 0.1 and t.sync_s > MODEL.sync_overhead_s
    assert t.trainer_s == pytest.approx(t.logprob_s + t.train_s + t.optimizer_s)
    double = cost.with_scale(2.0).step(batch)
    assert double.trainer_s == pytest.approx(2 * t.trainer_s) and double.sync_s == t.sync_s
    # packed sequences (verl's remove-padding) cost only their own tokens
    packed = TrainerCost(topology("h100x8-colocated:qwen3-8b")).step(
        TrainedBatch.of([100, 100], [10, 400]))
    padded = TrainerCost(topology("h100x8-colocated:qwen3-8b").__class__(
        **{**topology("h100x8-colocated:qwen3-8b").__dict__, "padding": "batch"})).step(
        TrainedBatch.of([100, 100], [10, 400]))
    assert packed.logprob_s < padded.logprob_s
    with pytest.raises(ValueError, match="unknown topology"):
        topology("tpu")


def test_the_two_accountings():
    t = TrainerTime(logprob_s=1.0, train_s=2.0, optimizer_s=0.5, sync_s=0.25)
    assert end_to_end(2.0, t, "colocated") == pytest.approx(5.75)
    assert end_to_end(2.0, t, "overlap") == pytest.approx(3.75)        # max(2, 3.5) + sync
    assert end_to_end(9.0, t, "overlap") == pytest.approx(9.25)
    with pytest.raises(ValueError):
        end_to_end(1.0, t, "nope")


def test_a_measured_table_replaces_the_model(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"rows": [{"shape": "qwen3-1.7b", "forward_s_per_token": 1e-6,
                                          "train_s_per_token": 4e-6, "optimizer_s": 0.02}]}))
    cost = TrainerCost.load(HEADLINE, path)
    t = cost.step(TrainedBatch.of([10] * 2, [90] * 2))
    assert cost.source == "measured" and t.logprob_s == pytest.approx(200e-6)
    assert t.train_s == pytest.approx(800e-6) and t.optimizer_s == 0.02
    with pytest.raises(ValueError, match="no measured row"):
        TrainerCost.load("h100x8-colocated:qwen3-8b", path)


def test_the_trainer_measurer_runs_on_the_cpu(tmp_path):
    import torch

    from vllm_rl.cost import measure_trainer

    tiny = Shape(layers=2, hidden=16, heads=2, kv_heads=1, head_dim=8, intermediate=32,
                 vocab=64, tied=True)
    torch.set_num_threads(1)
    row = measure_trainer.measure("tiny", tiny, rows=2, length=8, device=torch.device("cpu"),
                                  dtype=torch.float32, rounds=1, layers=1)
    assert row["layers_measured"] == 1
    assert row["forward_s_per_token"] > 0 and row["train_s_per_token"] > 0
    assert row["optimizer_s"] >= 0


def _run(name: str, seed: int, accs: list[float], rollout: float, prompt: int, completion: int):
    steps = [{"step": i + 1, "h100_s": rollout * 0.9, "h100_host_s": rollout, "heldout": a,
              "tokens": 100, "engine_steps": 10, "train_reward": 0.5, "length": 40.0,
              "trained": {"prompt_lengths": [prompt] * 8,
                          "completion_lengths": [completion] * 8}}
             for i, a in enumerate(accs)]
    return {"config": name, "seed": seed, "heldout_start": 0.5, "steps": steps}


def test_every_axis_priced_and_the_trainer_dilutes_a_rollout_gain():
    """A configuration whose rollout is half stock's, training the same batches: 2x on
    the rollout axis, less end to end, and less still with the trainer twice as slow."""
    from vllm_rl.bench.train import report as train

    cost = TrainerCost.load(HEADLINE)
    runs = [_run("stock", s, [0.6, 0.7], 1.0, 64, 2048) for s in range(2)]
    runs += [_run("das", s, [0.6, 0.7], 0.5, 64, 2048) for s in range(2)]
    train_budget.price(runs, cost)
    assert set(train_budget.present(runs)) == set(train_budget.AXES)
    summary = train.summarize(runs)
    sp = {a: summary["das"]["speedup"][a][-1]["mean"] for a in summary["das"]["speedup"]}
    assert sp["rollout"] == pytest.approx(2.0)
    assert 1.0 < sp["trainer x2"] < sp["e2e"] < sp["trainer x0.5"] < sp["rollout"]
    assert sp["e2e"] == pytest.approx(sp["e2e colocated"])         # the headline's accounting
    assert "e2e" in train.speedup_table(summary) and "rollout" in train.speedup_table(summary)
    assert "the trainer's time x2" in train.axes_table(summary)
    assert "0: " in train.seeds_table(summary)
    import argparse

    others = train.topology_table(runs, argparse.Namespace(topology=HEADLINE, trainer_cost=None))
    assert "h100x1-packed:qwen3-1.7b (colocated)" in others and "(overlap)" in others
    assert "| das | " in others and "8b" not in others
    old = [_run(r["config"], r["seed"], [0.6, 0.7], 1.0, 64, 2048) for r in runs]
    for r in old:
        for st in r["steps"]:
            del st["trained"]
    assert set(train_budget.present(old)) == {"rollout", "gpu"}      # before the trainer


def test_the_host_hidden_axis_and_where_the_time_goes():
    """The host-hidden axis prices the rollout's forward passes alone; reprice gives it to
    runs recorded before it; the parts of a colocated step add up to its end to end."""
    from vllm_rl.bench.train import report as train

    runs = [_run("stock", s, [0.6, 0.7], 1.0, 64, 256) for s in range(2)]
    runs += [_run("das+partial", s, [0.6, 0.7], 0.5, 64, 256) for s in range(2)]
    for r in runs:
        r["args"] = {"topology": HEADLINE, "trainer_cost": None}
        for st in r["steps"]:
            st.update(host_core_s=0.2, host_gc_s=0.01, cpu_share=0.5 if r["seed"] else 1.0)
    train_budget.reprice(runs)
    row = runs[0]["steps"][0]
    trainer = row["trainer"]
    assert row["e2e_gpu_s"] == pytest.approx(0.9 + trainer["trainer_s"] + trainer["sync_s"])
    assert row["e2e_s"] - row["e2e_gpu_s"] == pytest.approx(0.1)      # the host's part
    summary = train.summarize(runs)
    assert "e2e host hidden" in train.speedup_table(summary)
    text = train.parts_table(runs)
    assert "| rollout, host beyond them | 0.10 | 0.05 |" in text
    assert "| garbage collection, share of the core's host time | 5.0% | 5.0% |" in text
    ceiling = row["e2e_s"] / (trainer["trainer_s"] + trainer["sync_s"])
    assert f"stock's step {ceiling:.2f}× faster" in text
    assert "| the run's share of a CPU, lowest run (host times inflate below 1) | 0.50 | 0.50 |" in text
    del runs[1]["steps"][0]["host_gc_s"]                 # a run recorded before the field
    assert "| – |" in train.parts_table(runs)
    assert train.parts_table([r for r in runs if r["config"] != "stock"]) == ""


def test_checkpoint_state_round_trip(tmp_path):
    class Rollout:
        calls, _seen, planner, duet_allocation, arrol_feedback = 3, {"a"}, None, None, None
        last_arrol_update = {"head": {"w": [1.0]}, "version": 2}

    pushed = []

    class Engine:
        def arrol_update(self, **kw):
            pushed.append(kw)

    run_dir = train_resume.folder(tmp_path, "das+partial:tis", 1)
    assert run_dir.name == "das_partial_tis-s1" and train_resume.latest(run_dir) is None
    for step in (1, 2):
        (run_dir / f"checkpoint-{step}").mkdir(parents=True)
        train_resume.save(run_dir / f"checkpoint-{step}", {"steps": [step]}, Rollout())
    (run_dir / "checkpoint-3").mkdir()                       # TRL's, ours not yet written
    assert train_resume.latest(run_dir).name == "checkpoint-2"
    fresh = Rollout()
    fresh.calls, fresh.last_arrol_update = 0, None
    assert train_resume.restore(run_dir / "checkpoint-2", fresh, Engine()) == {"steps": [2]}
    assert fresh.calls == 3 and pushed == [Rollout.last_arrol_update]
    assert pickle.loads((run_dir / "checkpoint-2" / train_resume.STATE).read_bytes())
    train_resume.clear(run_dir)
    assert not run_dir.exists()
