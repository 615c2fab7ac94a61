"""``vllm-rl bench train``: the time-to-accuracy benchmark, as a smoke run (``--quick``)
and its summary arithmetic."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from vllm_rl.bench.train import command as train
from vllm_rl.bench.train import report as train_report
from vllm_rl.bench.train import run as train_run


def test_quick_run_resumes_from_its_last_step_and_writes_the_table_json_and_png(tmp_path):
    """Stock and all four, one seed, two GRPO steps each through TRL and the engines,
    priced end to end on the headline topology.  The first call stops stock after its
    first step, as if killed; ``--resume`` goes on from that step's checkpoint."""
    def bench(*extra):
        return subprocess.run([sys.executable, "-m", "vllm_rl.cli", "bench", "train", "--quick",
                               "--out", str(tmp_path), *extra], capture_output=True, text=True,
                              timeout=900)

    stopped = bench("--stop-after", "1", "--micro-batch", "4")
    assert stopped.returncode != 0 and "stopped after step 1" in stopped.stdout
    assert (tmp_path / "ckpt" / "stock-s0" / "checkpoint-1" / "bench_state.pkl").exists()
    done = bench("--resume", "--micro-batch", "4")
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]
    doc = json.loads((tmp_path / "train.json").read_text())
    assert (tmp_path / "train.png").stat().st_size > 10_000
    assert {r["config"] for r in doc["runs"]} == {"stock", "all"} and not doc["errors"]
    assert not (tmp_path / "ckpt" / "stock-s0").exists()        # cleared once finished
    stock = next(r for r in doc["runs"] if r["config"] == "stock")
    assert stock["resumed_at"] == [1] and [row["step"] for row in stock["steps"]] == [1, 2]
    budget = sum(row["e2e_s"] for row in stock["steps"])
    for run in doc["runs"]:
        if run["config"] == "stock":
            assert len(run["steps"]) == 2 and run["budget_s"] is None
        else:             # stock's end-to-end time, host counted: the same seed's budget
            spent = [row["e2e_s"] for row in run["steps"]]
            assert run["budget_s"] == pytest.approx(budget) and run["budget_axis"] == "e2e_s"
            assert sum(spent) >= budget or len(spent) == 3 * 2          # or --max-steps
            assert sum(spent[:-1]) < budget
        assert run["trainer_cost"]["topology"]["name"] == "h100x1-colocated:qwen3-1.7b"
        for row in run["steps"]:
            assert row["h100_s"] > 0 and row["engine_steps"] > 0 and "heldout" in row
            assert row["grad_norm"] >= 0
            assert row["h100_host_s"] >= row["h100_s"] and row["host_core_s"] > 0
            assert 0 <= row["host_gc_s"] <= row["host_core_s"] and row["cpu_share"] > 0
            rows = len(row["trained"]["completion_lengths"])     # 2 prompts x M, or more
            # rows per prompt where a group keeps more (DUET's eps-kept beside its M)
            assert rows == 2 * 4 if run["config"] == "stock" else rows >= 2 * 4
            assert row["trainer"]["trainer_s"] > 0
            assert row["e2e_s"] == pytest.approx(row["h100_host_s"] + row["trainer"]["trainer_s"]
                                                 + row["trainer"]["sync_s"])
            assert row["e2e_gpu_s"] == pytest.approx(row["h100_s"] + row["trainer"]["trainer_s"]
                                                     + row["trainer"]["sync_s"])
            assert {"diag_loss_samples_mean", "diag_zero_adv_groups", "diag_ess_fraction",
                    "diag_eps_weight_share"} <= set(row)
    allrun = next(r for r in doc["runs"] if r["config"] == "all")
    assert allrun["steps"][0]["redundant"] == 12        # planner: 1.5 M N for 2 prompts
    assert "| stock |" in done.stdout and "| all |" in done.stdout
    assert "time to stock's final" in done.stdout and "total end to end s" in done.stdout
    assert "Per seed" in done.stdout
    assert doc["summary"]["all"]["h100_host_vs_stock"] > 0
    assert doc["summary"]["all"]["steps"] == len(allrun["steps"])


def test_time_to_target_interpolates_on_cumulative_time():
    pts = [(0.0, 0.5), (10.0, 0.6), (20.0, 0.7)]
    assert train_report.time_to(pts, 0.65) == pytest.approx(15.0)
    assert train_report.time_to(pts, 0.5) == 0.0
    assert train_report.time_to(pts, 0.71) is None


def test_t_interval_over_seeds():
    m, lo, hi = train_report.t_interval([0.6, 0.7, 0.8])
    assert m == pytest.approx(0.7)
    assert hi - m == pytest.approx(4.303 * 0.1 / 3 ** 0.5, rel=1e-3)     # t(0.975, 2)
    assert train_report.t_interval([0.5]) == (0.5, 0.5, 0.5)


def test_summary_reports_time_to_stock_final_and_ratios():
    def run(name, seed, accs, h100):
        steps = [{"step": i + 1, "h100_s": h100, "tokens": 100, "engine_steps": 10,
                  "train_reward": 0.5, "length": 40.0, "heldout": a}
                 for i, a in enumerate(accs)]
        return {"config": name, "seed": seed, "heldout_start": 0.5, "steps": steps}

    runs = [run("stock", s, [0.55, 0.6, 0.65 + 0.01 * s], 2.0) for s in range(3)]
    runs += [run("all", s, [0.62, 0.66, 0.7], 1.0) for s in range(3)]
    summary = train_report.summarize(runs)
    st, al = summary["stock"], summary["all"]
    assert st["h100_total_s"] == 6.0 and al["h100_vs_stock"] == pytest.approx(2.0)
    assert st["final_lo"] < st["final"] < st["final_hi"]
    assert al["time_to_target_s"] < 2.0 and al["time_to_target_frac"] < 1 / 3
    assert "| all |" in train_report.table(summary)
    # paired by seed: all - stock = 0.7 - (0.65 + 0.01 s), mean 0.04, interval over 3 seeds
    assert al["delta"] == pytest.approx(0.04)
    assert al["delta_lo"] < 0.04 < al["delta_hi"] and st["delta"] == 0.0


def test_speedup_at_equal_accuracy_per_seed_and_its_interval():
    """Stock's time to a level over the configuration's, per seed; over seeds the
    geometric mean with a t-interval on the log scale (positive; 2x and 0.5x cancel)."""
    import math

    def run(name, seed, accs, h100):
        steps = [{"step": i + 1, "h100_s": h100, "h100_host_s": h100, "heldout": a}
                 for i, a in enumerate(accs)]
        return {"config": name, "seed": seed, "heldout_start": 0.5, "steps": steps}

    stock = [run("stock", s, [0.6, 0.7], 1.0) for s in range(2)]
    fast = [run("all", 0, [0.7, 0.7], 0.5), run("all", 1, [0.55, 0.6, 0.65, 0.7], 1.0)]
    sp = train_report.speedups(stock, fast, 0.7, "h100_host_s")
    assert sp["per_seed"] == {0: pytest.approx(4.0), 1: pytest.approx(0.5)}
    assert sp["mean"] == pytest.approx(math.sqrt(2.0))                 # geometric
    assert 0 < sp["lo"] < sp["mean"] < sp["hi"]
    assert math.log(sp["hi"] / sp["mean"]) == pytest.approx(math.log(sp["mean"] / sp["lo"]))
    assert train_report.speedups(stock, fast, 0.9, "h100_host_s")["seeds_reached"] == 0


def test_summary_host_counted_totals_and_runs_without_them():
    def run(name, host):
        row = {"step": 1, "h100_s": 1.0, "tokens": 100, "engine_steps": 10,
               "train_reward": 0.5, "length": 40.0, "heldout": 0.6}
        if host is not None:
            row["h100_host_s"] = host
        return {"config": name, "seed": 0, "heldout_start": 0.5, "steps": [row, dict(row)]}

    summary = train_report.summarize([run("stock", 1.5), run("all", 3.0)])
    assert summary["all"]["h100_host_total_s"] == 6.0
    assert summary["all"]["h100_host_vs_stock"] == pytest.approx(0.5)
    assert "6.0 (0.50×)" in train_report.table(summary)
    old = train_report.summarize([run("stock", None), run("all", None)])   # before host times
    assert old["all"]["h100_host_total_s"] is None and old["all"]["h100_host_vs_stock"] is None
    assert "| – |" in train_report.table(old)


def test_resume_reuses_only_runs_from_the_same_arguments(tmp_path):
    args = train.parser().parse_args(["--out", str(tmp_path)])
    (tmp_path / "runs").mkdir()
    run = {"config": "stock", "seed": 0, "args": train._run_args(args)}
    (tmp_path / "runs" / "stock-s0.json").write_text(__import__("json").dumps(run))
    assert train._finished(tmp_path, "stock", 0, args) == run
    assert train._finished(tmp_path, "stock", 1, args) is None
    args.max_tokens += 1
    assert train._finished(tmp_path, "stock", 0, args) is None
    args.max_tokens -= 1
    assert "micro_batch" not in run["args"]   # an argument added later, at its default
    args.micro_batch = args.prompts * args.m // 2
    assert train._finished(tmp_path, "stock", 0, args) is None


def test_configurations_are_combinations_and_project_options():
    from vllm_rl.bench.matrix import parse, technique_flags

    assert train.check_configs(["stock", "das", "das+darts:guard", "all", "duet:eps1"]) == []
    assert train.check_configs(["das+nope", "darts:nope", "das+das"]) == [
        "das+nope", "darts:nope", "das+das"]
    assert parse("das+darts:guard") == (("das", "darts"), {"darts": ("guard",)})
    assert technique_flags("duet:eps1", 256)["duet"]["eps"] == 1.0
    assert technique_flags("das:class", 256)["das"] == {"policy": "class"}


def test_levels_run_up_to_stocks_final_mean():
    def run(name, accs):
        steps = [{"step": i + 1, "h100_s": 1.0, "heldout": a} for i, a in enumerate(accs)]
        return {"config": name, "seed": 0, "heldout_start": 0.5, "steps": steps}

    by = {"stock": [run("stock", [0.6, 0.7])], "das": [run("das", [0.55, 0.6])]}
    assert train_report.levels(by, 0.7) == pytest.approx([0.55, 0.6, 0.65, 0.7])
    assert train_report.levels(by, None) == []


def test_bench_train_help_and_bad_config():
    def run(*args):
        return subprocess.run([sys.executable, "-m", "vllm_rl.cli", "bench", "train", *args],
                              capture_output=True, text=True, timeout=120)

    r = run("--help")
    assert r.returncode == 0 and "--seeds" in r.stdout and "--quick" in r.stdout
    r = run("--configs", "stock,nope")
    assert r.returncode == 2 and "nope" in r.stderr


def test_an_outside_heldout_set_is_disjoint_from_training_and_the_fixed_set():
    from vllm_rl.task import heldout_prompts, train_prompts

    args = train.parser().parse_args(["--heldout-seed", "7"])
    outside = train_run._heldout(args)
    assert len(outside) == args.eval_prompts == len(set(outside))
    assert not set(outside) & set(train_prompts(args.pool))
    assert not set(outside) & set(heldout_prompts(256))
    assert train_run._heldout(train.parser().parse_args([])) == heldout_prompts(args.eval_prompts)


def test_a_worker_that_dies_ends_its_run_with_an_error():
    """The OOM killer takes a worker mid-run: its run is reported failed (its seed's
    other runs are then dropped, not waited for) and the loop ends."""
    import queue

    class Proc:
        def __init__(self, pid, alive):
            self.pid, self.exitcode, self._alive = pid, None if alive else -9, alive

        def is_alive(self):
            return self._alive

    q = queue.Queue()
    for msg in [("start", "stock", 0, 11), ("start", "stock", 1, 12),
                ("step", "stock", 0, {"step": 1}), ("done", "stock", 1, {}),
                ("exit", None, None, 12)]:
        q.put(msg)
    got = list(train_run._messages(q, [Proc(11, alive=False), Proc(12, alive=True)]))
    assert [m[0] for m in got] == ["start", "start", "step", "done", "error"]
    assert got[-1][1:3] == ("stock", 0) and "exit code -9" in got[-1][3]
