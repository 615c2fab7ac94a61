"""``python -m vllm_rl.bench.das_lookahead``: the lookahead's tree call timed on a
synthetic step (each row verifying the tree's own draft), one figure per (k, H,
threads)."""
from __future__ import annotations

from vllm_rl.bench.das_lookahead import main, measure


def test_one_figure_per_setting():
    out = measure(rows=16, sound=(0, 3), hypotheses=(1, 64), length=128, repeats=1,
                  threads=(1, 2))
    assert [(r["k"], r["hypotheses"], r["threads"]) for r in out] == [
        (k, h, t) for k in (0, 3) for h in (1, 64) for t in (1, 2)]
    assert all(r["rows"] == 16 and r["ns_per_row"] > 0 and r["wall_ns_per_row"] > 0
               for r in out)
    assert out[0]["mean_k"] == 0 and 0 < out[4]["mean_k"] <= 3   # rows verify their drafts


def test_prints_a_table(capsys):
    main(["--rows", "8", "--sound", "2", "--hypotheses", "2", "--repeats", "1"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("| rows |") and lines[2].startswith("| 8 | 2 (")
