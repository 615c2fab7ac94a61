"""The regime's statistics, the gates' verdicts, the regime log and ``vllm-rl advise``."""
from __future__ import annotations

import json

import pytest

from vllm_rl import advice
from vllm_rl.regime import Regime, Sample, first_answer_tokens
from vllm_rl.regime_log import RecordsError, append, read


def test_first_answer_counts_tokens_over_bytes():
    pieces = [b" 3", b" +", b" 4", b" =", b" 7", b" so", b" \\boxed{", b" 7", b" }", b" wait"]
    assert first_answer_tokens(pieces) == 9
    assert first_answer_tokens(pieces[:8]) is None
    assert first_answer_tokens([b"\\boxed{7}"]) == 1


def _group(name, lengths, rewards, first=None, truncated=None):
    return [Sample(group=name, length=n, truncated=bool(truncated and truncated[i]),
                   first_answer=None if first is None else first[i], reward=r)
            for i, (n, r) in enumerate(zip(lengths, rewards))]


def test_regime_reads_groups_lengths_and_markers():
    samples = (_group("a", [10, 20, 30, 40], [1, 1, 0, 0], first=[5, 5, 5, 5])
               + _group("b", [10, 10, 10, 100], [1, 1, 1, 1], first=[5, 5, 5, None],
                        truncated=[0, 0, 0, 1]))
    r = Regime.of(samples, max_tokens=100)
    assert r.samples == 8 and r.groups == 2
    assert r.truncated == pytest.approx(1 / 8)
    assert r.correct_share == pytest.approx(0.75)
    assert r.all_or_none == pytest.approx(0.5)
    assert r.wrong_over_right_length == pytest.approx(35 / 15)
    # the marker-less sample ran to the limit, past the gate
    assert r.markerless_at_gate == pytest.approx(1 / 8)
    assert r.tokens_after_first_answer == pytest.approx((5 + 15 + 25 + 35 + 5 + 5 + 5) / 7)
    assert r.head_auc is None and r.draft_acceptance is None


def test_samples_ended_early_count_only_at_the_gate():
    natural = _group("a", [10, 20, 30, 40], [1, 1, 0, 0], first=[5, 5, 5, 5])
    aborted = Sample("a", 90, False, first_answer=None, reward=0.0, ended_early=True)
    r = Regime.of(natural + [aborted], max_tokens=100)
    assert r.samples == 4 and r.ended_early == 1
    assert r.length_p99 <= 40 and r.correct_share == pytest.approx(0.5)
    assert r.markerless_at_gate == pytest.approx(1 / 5)
    with pytest.raises(ValueError, match="ended by themselves"):
        Regime.of([aborted], max_tokens=100)


def test_regime_says_none_where_the_samples_cannot():
    r = Regime.of([Sample("g", 5, False), Sample("g", 7, False)], max_tokens=16)
    assert r.correct_share is None and r.wrong_over_right_length is None
    assert r.head_auc is None and r.draft_acceptance is None
    with pytest.raises(ValueError, match="no samples"):
        Regime.of([], max_tokens=16)


def test_head_and_drafts():
    samples = [Sample(f"g{i // 4}", 50, False, reward=float(i % 2), score=0.2 + 0.5 * (i % 2),
                      draft_proposed=10, draft_accepted=4) for i in range(16)]
    r = Regime.of(samples, max_tokens=64)
    assert r.head_auc == pytest.approx(1.0) and r.head_auc_within == pytest.approx(1.0)
    assert r.head_accuracy == pytest.approx(1.0)
    assert r.draft_acceptance == pytest.approx(0.4) and r.draft_tokens == 160


def _regime(**changes):
    base = Regime.of(_group("a", [10, 20, 30, 40], [1, 1, 0, 0], first=[5, 5, 5, 5]), 100)
    from dataclasses import replace

    return replace(base, **changes)


def test_duet_verdict_follows_the_papers_marker_less_range():
    assert advice.duet(_regime(markerless_at_gate=0.03)).decision == advice.ON
    off = advice.duet(_regime(markerless_at_gate=0.16))
    assert off.decision == advice.OFF and "6%" in off.why and off.rests_on


def test_darts_verdict_reads_the_tail():
    cut = dict(max_tokens=1024, length_p50=255, length_p99=1024)
    assert advice.darts(_regime(**cut, truncated=0.115)).decision == advice.ON
    assert advice.darts(_regime(**cut, truncated=0.034)).decision == advice.OFF
    whole = dict(max_tokens=4096, length_p50=100, truncated=0.0)
    assert advice.darts(_regime(**whole, length_p99=800)).decision == advice.ON
    assert advice.darts(_regime(**whole, length_p99=300)).decision == advice.OFF


def test_arrol_without_scores_is_no_evidence():
    assert advice.arrol(_regime()).decision == advice.NO_EVIDENCE
    assert advice.arrol(_regime(head_auc=0.8, head_auc_within=0.8, scored=100)).decision == advice.ON


def test_the_log_round_trips(tmp_path):
    path = tmp_path / "log.jsonl"
    samples = _group("a", [10, 20], [1, 0], first=[5, None])
    append(path, 1, samples, 64)
    append(path, 2, _group("b", [30, 40], [1, 1]), 64)
    got, limit = read(path)
    assert limit == 64 and got == samples + _group("b", [30, 40], [1, 1])
    last, _ = read(path, last_steps=1)
    assert [s.group for s in last] == ["b", "b"]


@pytest.mark.parametrize("text, message", [
    ("", "no records"),
    ("{not json\n", "not JSON"),
    ("[1, 2]\n", "JSON object"),
    ('{"group": "a", "length": 3}\n', "missing truncated, max_tokens"),
    ('{"group": "a", "length": -1, "truncated": false, "max_tokens": 8}\n', "length"),
    ('{"group": "a", "length": 3, "truncated": "no", "max_tokens": 8}\n', "truncated"),
    ('{"group": "a", "length": 3, "truncated": false, "max_tokens": 8, "first_answer": 9}\n',
     "first_answer"),
    ('{"group": "a", "length": 3, "truncated": false, "max_tokens": 8, "reward": "yes"}\n',
     "reward"),
    ('{"group": "a", "length": 3, "truncated": false, "max_tokens": 8}\n'
     '{"group": "a", "length": 3, "truncated": false, "max_tokens": 16}\n', "several"),
])
def test_advise_says_what_is_wrong_with_a_log(tmp_path, capsys, text, message):
    from vllm_rl.cli.advise import main

    path = tmp_path / "log.jsonl"
    path.write_text(text)
    with pytest.raises(RecordsError, match=message):
        read(path)
    with pytest.raises(SystemExit) as e:
        main([str(path)])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert message.split(",")[0] in err and "Traceback" not in err


def test_advise_on_a_missing_file(capsys):
    from vllm_rl.cli.advise import main

    with pytest.raises(SystemExit):
        main(["/nonexistent/log.jsonl"])
    assert "no such file" in capsys.readouterr().err


def test_advise_prints_each_technique(tmp_path, capsys):
    from vllm_rl.cli.advise import main

    path = tmp_path / "log.jsonl"
    append(path, 1, _group("a", [10, 20, 30, 40], [1, 1, 0, 0], first=[5, 5, 5, 5]), 64)
    main([str(path)])
    out = capsys.readouterr().out
    for name in ("arrol", "duet", "das", "darts"):
        assert f"| {name} |" in out
    main([str(path), "--json"])
    data = json.loads(capsys.readouterr().out)
    assert {v["technique"] for v in data["verdicts"]} == {"arrol", "duet", "das", "darts"}


def test_bench_regime_table_sets_each_row_beside_the_papers(tmp_path):
    from vllm_rl.bench import regime as bench

    r = Regime.of(_group("a", [10, 20, 30, 40], [1, 1, 0, 0], first=[5, 5, 5, 5]), 64)
    results = [{"kit": k, "l_detect": 24, "max_tokens": 64, "regime": r.as_dict(),
                "rows": [[10, False, 5, 1.0], [40, False, 5, 0.0]]} for k in ("arith", "reasoning")]
    text = bench.table(results)
    assert "| arith (l_detect 24) | reasoning (l_detect 24) | the papers |" in text
    assert text.count("\n") == 10 and "A.4" in text and "82.37%" in text
    assert bench.verdict_table(results).count("| reasoning |") == 4
    bench.plot(results, tmp_path / "regime.png")
    assert (tmp_path / "regime.png").stat().st_size > 0


@pytest.mark.parametrize("kit, duet, darts", [("arith", "off", "off"),
                                              ("reasoning", "on", "on")])
def test_advise_on_each_kits_records(capsys, kit, duet, darts):
    """The regime logs `vllm-rl bench regime` wrote of each kit's samples (committed in
    docs/results/regime/): what a user would bring."""
    from pathlib import Path

    from vllm_rl.cli.advise import main

    log = Path(__file__).resolve().parents[2] / "docs/results/regime" / f"{kit}-regime.jsonl"
    main([str(log), "--json"])
    got = {v["technique"]: v["decision"] for v in json.loads(capsys.readouterr().out)["verdicts"]}
    assert got["duet"] == duet and got["darts"] == darts and got["das"] == "on"


# ---------------------------------------------------------------- from a server's /metrics
def _page(lengths, ended, gauges=None, drafts=(0, 0)):
    """A /metrics page as the front end writes it: the natural-length histogram of
    ``lengths``, samples_ended by reason, the gauges (NaN where unset)."""
    from vllm_rl.metrics import GAUGES, LENGTH_BUCKETS

    lines = ["# TYPE vllm_rl:sample_length histogram"]
    for le in LENGTH_BUCKETS + (float("inf"),):
        n = sum(1 for x in lengths if x <= le)
        lines.append(f'vllm_rl:sample_length_bucket{{le="{"+Inf" if le == float("inf") else float(le)}"}} {n}')
    lines += [f"vllm_rl:sample_length_count {len(lengths)}",
              f"vllm_rl:sample_length_sum {sum(lengths)}",
              "# TYPE vllm_rl:samples_ended counter"]
    lines += [f'vllm_rl:samples_ended_total{{reason="{r}"}} {n}' for r, n in ended.items()]
    lines += ["# TYPE vllm_rl:draft_tokens_proposed counter",
              f"vllm_rl:draft_tokens_proposed_total {drafts[0]}",
              "# TYPE vllm_rl:draft_tokens_accepted counter",
              f"vllm_rl:draft_tokens_accepted_total {drafts[1]}"]
    for name in GAUGES:
        value = (gauges or {}).get(name, float("nan"))
        lines += [f"# TYPE vllm_rl:{name} gauge", f"vllm_rl:{name} {value}"]
    return "\n".join(lines) + "\n"


def _served(page):
    from vllm_rl.metrics import parse
    from vllm_rl.served_regime import ServedRegime

    return ServedRegime.of(parse(page))


def test_served_regime_reads_buckets_shares_and_unset_gauges():
    lengths = [50] * 90 + [300] * 6 + [1024] * 4
    s = _served(_page(lengths, {"eos": 96, "length": 4, "duet_aborted": 7},
                      {"duet_markerless_share": 0.023, "duet_gate_open": 1.0}, (100, 80)))
    assert s.samples == 100 and s.ended_early == 7
    assert s.length_mean == sum(lengths) / 100
    assert s.length_p50 == (32, 64) and s.length_p99 == (512, 1024)
    assert s.truncated == 0.04 and s.markerless_at_gate == 0.023 and s.duet_gate_open
    assert s.head_auc_within is None and s.arrol_gate_open is None      # NaN: never shown
    assert s.draft_acceptance == 0.8 and s.draft_tokens == 100
    got = {v.technique: v.decision for v in advice.served(s)}
    assert got == {"duet": "on", "darts": "off", "das": "on", "arrol": "no evidence"}


def test_served_darts_decides_only_where_the_buckets_leave_no_doubt():
    def darts(lengths, cut=0):
        page = _page(lengths, {"eos": len(lengths) - cut, "length": cut})
        return advice.served(_served(page))[3]

    assert darts([40] * 98 + [1000] * 2).decision == advice.ON    # p99/p50 >= 512/64
    assert darts([40] * 100).decision == advice.OFF               # p99/p50 <= 64/32
    assert darts([40] * 98 + [150] * 2).decision == advice.NO_EVIDENCE   # 2x to 8x
    assert darts([40] * 90 + [256] * 10, cut=10).decision == advice.ON   # 10% at the limit
    empty = advice.served(_served(_page([], {})))
    assert {v.decision for v in empty if v.technique != "das"} == {advice.NO_EVIDENCE}


def test_advise_reads_a_saved_metrics_page(tmp_path, capsys):
    from vllm_rl.cli.advise import main

    path = tmp_path / "metrics.txt"
    path.write_text(_page([50] * 100, {"eos": 100},
                          {"duet_markerless_share": 0.16, "duet_gate_open": 0.0,
                           "arrol_head_auc": 0.58, "arrol_gate_open": 0.0}))
    main(["--metrics", str(path)])
    out = capsys.readouterr().out
    assert "16.0% (gate shut)" in out and "| duet | off |" in out and "| arrol | off |" in out
    main(["--metrics", str(path), "--json"])
    data = json.loads(capsys.readouterr().out)
    assert data["regime"]["length_p50"] == [32.0, 64.0]


@pytest.mark.parametrize("args, message", [
    ([], "one of them"),
    (["log.jsonl", "--metrics", "x"], "one of them"),
    (["--metrics", "/nonexistent/metrics.txt"], "cannot read /metrics"),
    (["--metrics", "http://127.0.0.1:9/metrics"], "cannot read /metrics"),
    (["--metrics", "PAGE"], "no vllm_rl: series"),
    (["--metrics", "BAD"], "cannot read /metrics"),
])
def test_advise_says_what_is_wrong_with_metrics(tmp_path, capsys, args, message):
    from vllm_rl.cli.advise import main

    (tmp_path / "page").write_text("# TYPE vllm:x counter\nvllm:x_total 1.0\n")
    (tmp_path / "bad").write_text("vllm_rl:x{ 1 2 3\n")
    args = [str(tmp_path / "page") if a == "PAGE" else str(tmp_path / "bad") if a == "BAD"
            else a for a in args]
    with pytest.raises(SystemExit) as e:
        main(args)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


# ------------------------------------------------------------------ DARTS's regime gate
def test_darts_planner_regime_gate_turns_darts_off_outside_its_regime():
    from vllm_rl.darts.controller import DartsPlanner

    planner = DartsPlanner(8, budget=1.5, max_tokens=256, regime_gate=True)
    ids = [f"p{i}" for i in range(8)]
    assert planner.plan(ids)[0].n > 8                     # no lengths yet: the paper's
    assert planner.metrics["darts/regime_gate_open"] == 1.0
    planner.observe({p: [40 + i for i in range(8)] for p in ids})   # short, no tail
    plans = planner.plan(ids)
    assert all(p.off for p in plans) and planner.metrics["darts/regime_gate_open"] == 0.0
    assert planner.metrics["darts/regime_tail"] < 5 and planner.last_budget == 1.0
    planner.observe({p: [40] * 6 + [256] * 2 for p in ids})         # 25% at the limit
    plans = planner.plan(ids)
    assert planner.metrics["darts/regime_gate_open"] == 1.0 and any(not p.off for p in plans)


def test_darts_regime_window_leaves_out_early_stopped_groups():
    from vllm_rl.darts.controller import DartsPlanner

    planner = DartsPlanner(4, budget=2.0, max_tokens=100, regime_gate=True)
    plans = planner.plan(["a"])
    assert plans[0].early_stop                            # saturated: stopped early
    planner.observe({"a": [10, 11, 12, 13, 5, 6, 7, 8]})  # censored lengths: not read
    assert len(planner.regime.lengths) == 0
    with pytest.raises(ValueError, match="max_tokens"):
        DartsPlanner(4, regime_gate=True)
