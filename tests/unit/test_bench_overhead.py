"""``vllm-rl bench overhead`` (host mode): the figures, the budgets, the table and the JSON,
on hand-built runs (no engine, no timing)."""
import json

import pytest

from vllm_rl.bench.overhead import budget as ob


def _run(live, schedule, update, drafter=None, scorer=None, decode=None, scored=None):
    n = len(live)
    return {"live": live, "tokens": list(live), "decode": decode or [True] * n,
            "schedule_ns": schedule, "update_ns": update,
            "drafter_ns": drafter or [0] * n, "scorer_ns": scorer or [0] * n,
            "scored_rows": scored}


def test_run_figures_window_is_decode_steps_at_the_target_after_skip():
    # steps: 2 prefill, 1 skipped decode, 3 full decode, 1 drained decode (below floor)
    live = [100, 100, 100, 100, 100, 100, 50]
    decode = [False, False, True, True, True, True, True]
    sched = [9_000_000, 9_000_000, 5_000_000, 100_000, 200_000, 300_000, 1_000_000]
    upd = [1_000_000, 1_000_000, 5_000_000, 100_000, 100_000, 100_000, 1_000_000]
    f = ob.run_figures(_run(live, sched, upd, decode=decode, scorer=[0, 0, 0, 0, 400_000, 0, 0],
                            scored=10), target=100, floor=0.9, skip=1)
    assert f["window_steps"] == 3 and f["decode_steps"] == 5 and f["prefill_steps"] == 2
    assert f["schedule_us"] == pytest.approx(600 / 300)        # 600 µs over 300 request-steps
    assert f["update_us"] == pytest.approx(1.0)
    assert f["core_us"] == pytest.approx(3.0)
    assert f["scorer_us_per_step"] == pytest.approx(400 / 3)
    assert f["scorer_us_per_row"] == pytest.approx(40.0)
    assert f["host_us"] == pytest.approx(3.0 + 400 / 300)
    assert f["prefill_core_us"] == pytest.approx(20_000 / 200)
    assert f["window_mean_live"] == 100


def test_run_figures_leaves_out_descheduled_steps_but_not_the_scorer_spike():
    live = [10] * 5
    sched = [10_000, 10_000, 10_000, 10_000, 5_000_000]       # the last: 500x the median
    scorer = [0, 0, 0, 0, 9_000_000]
    f = ob.run_figures(_run(live, sched, [0] * 5, scorer=scorer), target=10, skip=0)
    assert f["outliers"] == {"core": 1, "drafter": 0}
    assert f["core_us"] == pytest.approx(1.0)
    assert f["core_us_unfiltered"] == pytest.approx(5040 / 50)
    assert f["scorer_us"] == pytest.approx(9000 / 50)
    assert f["host_us"] == pytest.approx(1.0 + 180.0)
    f = ob.run_figures(_run(live, sched, [0] * 5), target=10, skip=0, outlier=0)
    assert f["outliers"]["core"] == 0 and f["core_us"] == pytest.approx(5040 / 50)


def test_run_figures_pads_outputs_not_back_and_empty_window():
    f = ob.run_figures(_run([10, 10], [1000, 1000], [1000]), target=10, skip=0)
    assert f["update_us"] == pytest.approx(1000 / 1e3 / 20)
    f = ob.run_figures(_run([1, 1], [1, 1], [1, 1]), target=10, skip=0)
    assert f["window_steps"] == 0 and f["core_us"] is None and f["scorer_us_per_row"] is None


def _runs(workload, stock_core, rl_core, rl_drafter=0.0, live=1024):
    out = []
    for rep, (s, r) in enumerate(zip(stock_core, rl_core)):
        for engine, core, drafter in (("stock", s, 0.0), ("rl", r, rl_drafter)):
            out.append({"engine": engine, "workload": workload, "live": live, "repeat": rep,
                        "figures": {"core_us": core, "drafter_us": drafter,
                                    "host_us": core + drafter, "window_mean_live": live}})
    return out


def test_summarize_pairs_repeats_and_takes_medians():
    rows = ob.summarize(_runs("das", [10.0, 20.0, 10.0], [12.0, 20.0, 13.0], 2.0)
                        + _runs("flagless", [10.0], [10.0], live=128))
    assert [(r["live"], r["workload"]) for r in rows] == [(128, "flagless"), (1024, "das")]
    das = rows[1]
    assert das["repeats"] == 3
    assert das["stock"]["core_us"] == {"median": 10.0, "min": 10.0, "max": 20.0, "n": 3}
    assert das["core_ratio"]["median"] == pytest.approx(1.2)       # 1.2, 1.0, 1.3
    assert das["core_ratio"]["min"] == pytest.approx(1.0)
    assert das["host_ratio"]["median"] == pytest.approx(1.4)       # (12+2)/10, 22/20, 15/10


@pytest.mark.parametrize("workload,stock,rl,drafter,expect", [
    ("darts", [10.0], [12.5], 0.0, {"scheduler": True}),
    ("duet", [10.0], [12.6], 0.0, {"scheduler": False}),
    ("das", [10.0], [11.0], 3.0, {"scheduler": True, "drafter": True}),
    ("all", [10.0], [11.0], 3.1, {"scheduler": True, "drafter": False}),
    ("flagless", [10.0], [10.4], 0.0, {"flagless": True}),      # within ±5%
    ("flagless", [10.0], [10.6], 0.0, {"flagless": False}),
    # stock's own spread (20%) widens "within noise"
    ("flagless", [9.0, 11.0, 10.0], [11.0, 11.0, 11.0], 0.0, {"flagless": True}),
])
def test_budgets(workload, stock, rl, drafter, expect):
    row = ob.summarize(_runs(workload, stock, rl, drafter))[0]
    got = ob.check_budgets(row)
    assert {k: v["pass"] for k, v in got.items()} == expect


def test_budget_without_a_figure_is_undecided():
    row = {"workload": "das", "stock": {}, "rl": {}, "core_ratio": None}
    got = ob.check_budgets(row)
    assert got["scheduler"]["pass"] is None and got["drafter"]["pass"] is None


def test_table_and_document_round_trip(tmp_path):
    runs = _runs("flagless", [10.0, 10.0], [10.2, 10.1]) + _runs("das", [10.0, 10.0],
                                                                  [14.0, 13.0], 5.0)
    doc = ob.document({"live": "1024"}, {"rl": {"scheduler": "x"}}, runs, {"load_avg": [1.0]})
    doc = json.loads(json.dumps(doc))           # JSON-serialisable
    assert doc["all_pass"] is False             # das: 1.35 > 1.25, drafter 5 > 3
    assert [r["workload"] for r in doc["rows"]] == ["flagless", "das"]
    assert doc["rows"][0]["budgets"]["flagless"]["pass"] is True
    text = ob.table(doc["rows"])
    lines = text.splitlines()
    assert len(lines) == 4 and lines[0].count("|") == len(ob.TABLE_HEAD) + 1
    assert "| 1024 | das | 10.00 | 13.50 | 1.350 (1.30–1.40) | FAIL (≤ 1.25) | 5.000 | FAIL" \
        in text
    assert "pass (≤ 1.05) host" in lines[2]


def test_picture_writes_a_png(tmp_path):
    rows = ob.summarize(_runs("flagless", [10.0], [10.2]) + _runs("das", [10.0], [12.0], 2.0)
                        + _runs("das", [9.0], [9.5], 1.0, live=128))
    path = ob.picture(rows, tmp_path / "o.png", "t")
    assert path.read_bytes()[:4] == b"\x89PNG"
    assert ob.picture([], tmp_path / "none.png", "t") is None


def test_scheduler_mode_runs_whole_rollouts_with_every_early_end():
    """--mode scheduler: the same requests and tokens on vLLM's Scheduler and on the RL
    scheduler; every sample ends, the RL one with each workload's early ends."""
    from vllm_rl.bench.overhead.scheduler import run_once

    stock = run_once(False, "all", live=32, max_tokens=64)
    rl = run_once(True, "all", live=32, max_tokens=64)
    assert stock["ends"] == {"stock": 32}
    assert sum(rl["ends"].values()) == 32
    assert {"arrol_pruned", "duet_aborted", "eos"} <= set(rl["ends"])
    assert rl["request_steps"] < stock["request_steps"]      # early ends free the batch
    assert run_once(True, "flagless", live=8, max_tokens=32)["ends"] == {"stock": 8}
