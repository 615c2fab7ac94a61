"""``vllm-rl bench points`` end to end at a tiny size, and the ``vllm-rl bench step`` run
under it (the main job's benchmark): the three engines, the previous steps, every
configuration against stock, the JSON, the PNGs and ``vllm-rl bench report`` on the JSON;
the points over two sizes; ``vllm-rl bench host-parts``."""
from __future__ import annotations

import json
import subprocess
import sys


def test_points_bench_runs_every_configuration_and_writes_the_tables_and_pictures(tmp_path):
    """One size live: ``vllm-rl bench step``'s three engines (stock vLLM, RL, RL with
    DAS), the previous steps, every configuration against stock, the step's JSON, PNGs and
    ``vllm-rl bench report`` on it; the points' table and picture over two sizes and the
    merge of labelled runs from that run's own points."""
    from vllm_rl.bench import points

    configs = ("darts", "duet", "das", "arrol", "das+duet+arrol", "all")
    cmd = [sys.executable, "-m", "vllm_rl.cli", "bench", "points", "--sizes", "2",
           "--seeds", "0", "--m", "2", "--max-tokens", "32", "--configs", ",".join(configs),
           "--das-config", '{"batch_cap": "phase"}',
           "--kv-gib-per-seq", "0.05", "--out", str(tmp_path / "live")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]

    # the step run under it, as `vllm-rl bench step` writes it
    [path] = (tmp_path / "live" / "runs").glob("step-*.json")
    step = json.loads(path.read_text())
    rows = {r["config"]: r for r in step["summary"]}
    assert {"stock-2", *configs} <= set(rows)
    for name, row in rows.items():
        assert row["tokens"] > 0 and row["engine_steps"] > 0 and row["projected_ms"] > 0, name
        # host time counted on top of (or overlapped with) the forward passes, never less
        assert row["host_counted_ms"] >= row["projected_ms"] and row["host_core_ms"] > 0, name
        assert row["asynchronous"] is True, name      # every engine, DAS's included
    assert rows["stock-2"]["gpu_speedup"] == 1.0 == rows["stock-2"]["host_speedup"]
    assert rows["das"]["host_worker_ms"] > 0                 # the drafter, in-process
    assert step["args"]["host_scale"] == 1.0
    assert json.loads(step["args"]["das_config"])["batch_cap"] == "phase"
    assert len(list(path.parent.glob("step-*.png"))) == 3      # lengths, running, timeline
    assert "PROJECTION" in done.stdout and "| all |" in done.stdout
    assert "+host x (proj.)" in done.stdout and "MEASURED on this CPU" in done.stdout
    assert (path.parent / "vllm.log").stat().st_size > 0
    report = subprocess.run([sys.executable, "-m", "vllm_rl.cli", "bench", "report", str(path)],
                            capture_output=True, text=True, timeout=120)
    assert report.returncode == 0 and "| all |" in report.stdout

    # the points over it
    doc = json.loads((tmp_path / "live" / "points.json").read_text())
    assert [(p["prompts"], p["seed"]) for p in doc["points"]] == [(2, 0)]
    agg = doc["aggregate"]
    assert set(agg) == {"stock-4", *configs}
    for cells in agg.values():
        assert set(cells) == {"2"}
        assert all(c["host_mean"] > 0 and c["gpu_mean"] > 0 for c in cells.values())
    assert (tmp_path / "live" / "points.png").stat().st_size > 0
    assert "| das |" in done.stdout and "host-counted" in done.stdout

    # the same run's point at a second size: one table column and one picture point each
    [point] = doc["points"]
    two = [point, {**point, "prompts": 4}]
    agg2 = points.aggregate(two, 2)
    assert set(agg2["das"]) == {"2", "4"} and agg2["das"]["2"] == agg2["das"]["4"]
    header = points.table(agg2, [2, 4], 2).splitlines()[0]
    assert "2x2 host-counted" in header and "4x2 GPU-only" in header
    args = points.parser().parse_args(["--m", "2", "--max-tokens", "32"])
    assert points.picture(agg2, [2, 4], args, tmp_path / "two.png").stat().st_size > 0
    merged = tmp_path / "merged"
    points.main(["--merge", str(tmp_path / "live" / "points.json"),
                 str(tmp_path / "live" / "points.json"), "--labels", "a,b", "--m", "2",
                 "--out", str(merged)])
    labelled = json.loads((merged / "points.json").read_text())["aggregate"]
    assert set(labelled) == {"stock-4"} | {f"{c} [{x}]" for c in configs for x in "ab"}
    assert labelled["das [a]"]["2"]["host"] == agg["das"]["2"]["host"]
    assert len(labelled["stock-4"]["2"]["host"]) == 2
    assert (merged / "points.png").stat().st_size > 0


def test_host_parts_bench_times_each_engines_parts(tmp_path):
    """``vllm-rl bench host-parts`` at a tiny size: stock and the DAS engine with partial
    rollouts (its third step timed, the carried samples' continuations in it), every engine
    step's parts charged to it, the table, the complete groups delivered, the JSON and the
    picture; the wrapped methods are vLLM's and the project's own (the run fails if one is
    renamed)."""
    cmd = [sys.executable, "-m", "vllm_rl.cli", "bench", "host-parts", "--prompts", "4",
           "--m", "2", "--max-tokens", "32", "--kv-gib", "0.25", "--out", str(tmp_path),
           "--engines", "stock,das+partial"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]
    doc = json.loads((tmp_path / "host-parts.json").read_text())
    stock, das = doc["steps"]["stock"], doc["steps"]["das+partial"]
    for steps in (stock, das):
        n = len(steps["widths"])
        assert n > 0 and len(steps["gpu_ms"]) == n
        assert sum(steps["parts"]["schedule"]) > 0 and sum(steps["parts"]["update_from_output"]) > 0
    assert sum(stock["parts"]["DAS before_step"]) == 0 < sum(das["parts"]["DAS before_step"])
    assert sum(das["parts"]["_admit (admissions)"]) > 0         # its samples admitted
    assert sum(das["parts"]["StepBook.due (step rules)"]) > 0    # the step book walked
    assert sum(stock["parts"]["StepBook.due (step rules)"]) == 0
    delivered = doc["delivered"]
    assert delivered["stock"]["groups"] == 4 and 0 < delivered["das+partial"]["groups"] <= 8
    assert "| forward pass (projected) |" in done.stdout and "complete groups" in done.stdout
    assert (tmp_path / "host-parts.png").stat().st_size > 0
