"""``vllm-rl bench points --merge``: runs that rest on different histories say each one's."""
from pathlib import Path

from vllm_rl.bench import points

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results" / "history"


def test_a_merge_of_runs_on_different_histories_names_each_runs_by_its_label(tmp_path, capsys):
    points.main(["--merge", str(RESULTS / "points-h1.json"), str(RESULTS / "points-h2.json"),
                 "--labels", "one,two", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert "[one] the arith kit's prompts outside" in out
    assert "1 earlier step(s) of the same prompts (8 rollouts per problem" in out
    assert "[two] the arith kit's prompts outside" in out
    assert "2 earlier step(s) of the same prompts (16 rollouts per problem" in out
    assert "| das [one] |" in out and "| das [two] |" in out
    assert (tmp_path / "points.png").exists()


def test_a_merge_of_runs_on_the_same_history_says_it_once(tmp_path, capsys):
    h1 = str(RESULTS / "points-h1.json")
    points.main(["--merge", h1, h1, "--labels", "a,b", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert out.count("1 earlier step(s)") == 1 and "[a]" not in out.split("|")[0]
