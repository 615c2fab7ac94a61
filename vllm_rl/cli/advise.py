"""``vllm-rl advise``: which techniques to switch on, read from your own rollouts.

    vllm-rl advise regime.jsonl                  # a drop-in's regime log (a few steps)
    vllm-rl advise regime.jsonl --last-steps 3   # only the last 3 steps it holds
    vllm-rl advise regime.jsonl --json           # the figures and verdicts as JSON
    vllm-rl advise --metrics http://host:8000    # a running server's /metrics
    vllm-rl advise --metrics page.txt            # a saved /metrics page

The log is what a drop-in writes with ``regime_log`` (TRL: ``RolloutFunc(regime_log=
PATH)``; :mod:`vllm_rl.regime_log`): one line per sample.  For each technique it prints
the regime statistics its gate reads (:class:`vllm_rl.regime.Regime`), what the gate
would decide (:mod:`vllm_rl.advice`) and the benchmark row the advice rests on.

``--metrics`` reads the counters the server keeps for its flagged samples
(:class:`vllm_rl.served_regime.ServedRegime`): no rewards and length quantiles only as
histogram buckets, so it says less than a log; where it cannot say, the gate's verdict is
"no evidence".
"""
from __future__ import annotations

import argparse
import json
import sys


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="vllm-rl advise", description=__doc__.split("\n\n")[0])
    ap.add_argument("log", nargs="?", help="a regime log (JSON lines, vllm_rl.regime_log)")
    ap.add_argument("--metrics", metavar="URL|FILE",
                    help="read a server's /metrics instead: its address (http://host:port, "
                         "/metrics appended if missing) or a saved page")
    ap.add_argument("--last-steps", type=int, default=None,
                    help="read only the log's last N steps (default: all)")
    ap.add_argument("--json", action="store_true", help="print JSON instead of tables")
    return ap


def pct(x) -> str:
    return "–" if x is None else f"{100 * x:.1f}%"


def num(x, fmt: str = ".2f") -> str:
    return "–" if x is None else format(x, fmt)


def verdict_table(verdicts) -> list[str]:
    """Each technique's verdict, a table row each."""
    return (["", "| technique | its gate | why | rests on |", "|---|---|---|---|"]
            + [f"| {v.technique} | {v.decision} | {v.why} | {v.rests_on} |" for v in verdicts])


def render(regime, verdicts) -> str:
    r = regime
    early = (f" ({r.ended_early} more ended early by a technique: they count only at "
             "DUET's gate)" if r.ended_early else "")
    lines = [f"{r.samples} samples in {r.groups} groups, response limit {r.max_tokens}{early}",
             "",
             "| statistic | your rollouts |", "|---|---|",
             f"| samples with no marker at DUET's gate K2 + G = {r.gate} | "
             f"{pct(r.markerless_at_gate)} |",
             f"| tokens after the first answer: per sample; share of all | "
             f"{num(r.tokens_after_first_answer, '.0f')}; {pct(r.share_after_first_answer)} |",
             f"| length p50 / p90 / p99 | {r.length_p50:.0f} / {r.length_p90:.0f} / "
             f"{r.length_p99:.0f} |",
             f"| share cut by the limit | {pct(r.truncated)} |",
             f"| DARTS's rho (all lengths); per-prompt sigma/mean | {r.rho:.2f}; "
             f"{r.rho_per_prompt:.2f} |",
             f"| wrong / right length within a group | {num(r.wrong_over_right_length)} |",
             f"| correct share within groups; all right or all wrong | "
             f"{pct(r.correct_share)}; {pct(r.all_or_none)} |",
             f"| ARRoL's head: AUC pooled / within groups; accuracy ({r.scored} scored) | "
             f"{num(r.head_auc)} / {num(r.head_auc_within)}; {pct(r.head_accuracy)} |",
             f"| DAS: accepted tokens per draft token | {num(r.draft_acceptance)} |"]
    return "\n".join(lines + verdict_table(verdicts))


def render_served(s, verdicts) -> str:
    def bucket(b):
        return "–" if b is None else f"({b[0]:.0f}, {b[1]:.0f}]"

    def gate(x):
        return "" if x is None else (" (gate open)" if x else " (gate shut)")

    early = f" ({s.ended_early} more ended early by a technique)" if s.ended_early else ""
    lines = [f"{s.samples} flagged samples ended by themselves or at the limit{early}",
             "", "| statistic | this server's /metrics |", "|---|---|",
             f"| samples with no marker at DUET's gate K2 + G | {pct(s.markerless_at_gate)}"
             f"{gate(s.duet_gate_open)} |",
             f"| length mean; p50 / p90 / p99 in the bucket | {num(s.length_mean, '.0f')}; "
             f"{bucket(s.length_p50)} / {bucket(s.length_p90)} / {bucket(s.length_p99)} |",
             f"| share cut by the limit | {pct(s.truncated)} |",
             f"| ARRoL's head: held-out within-group AUC | {num(s.head_auc_within)}"
             f"{gate(s.arrol_gate_open)} |",
             f"| DAS: accepted tokens per draft token | {num(s.draft_acceptance)} |"]
    return "\n".join(lines + verdict_table(verdicts))


def read_metrics(where: str) -> str:
    """The ``/metrics`` page at ``where`` (an http(s) address) or in a file."""
    if where.startswith(("http://", "https://")):
        import urllib.request

        url = where if where.rstrip("/").endswith("/metrics") else where.rstrip("/") + "/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.read().decode("utf-8", "replace")
    with open(where, encoding="utf-8") as f:
        return f.read()


def advise_served(where: str, as_json: bool) -> None:
    from vllm_rl.advice import served
    from vllm_rl.metrics import parse
    from vllm_rl.served_regime import ServedRegime

    try:
        page = read_metrics(where)
        flat = parse(page)
    except (OSError, ValueError) as e:
        print(f"vllm-rl advise: cannot read /metrics from {where}: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    if not any(key.startswith("vllm_rl:") for key in flat):
        print(f"vllm-rl advise: {where} has no vllm_rl: series: is it a vllm-rl server "
              "that has served a flagged request?", file=sys.stderr)
        raise SystemExit(2)
    regime = ServedRegime.of(flat)
    found = served(regime)
    if as_json:
        from dataclasses import asdict

        print(json.dumps({"regime": regime.as_dict(), "verdicts": [asdict(v) for v in found]},
                         indent=1))
    else:
        print(render_served(regime, found))


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    from dataclasses import asdict

    from vllm_rl.advice import verdicts
    from vllm_rl.regime import Regime
    from vllm_rl.regime_log import RecordsError, read

    if (args.log is None) == (args.metrics is None):
        print("vllm-rl advise: give a regime log or --metrics (one of them)", file=sys.stderr)
        raise SystemExit(2)
    if args.metrics is not None:
        advise_served(args.metrics, args.json)
        return
    if args.last_steps is not None and args.last_steps < 1:
        print("vllm-rl advise: --last-steps is at least 1", file=sys.stderr)
        raise SystemExit(2)
    try:
        samples, max_tokens = read(args.log, args.last_steps)
    except RecordsError as e:
        print(f"vllm-rl advise: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    regime = Regime.of(samples, max_tokens)
    found = verdicts(regime)
    if args.json:
        print(json.dumps({"regime": regime.as_dict(),
                          "verdicts": [asdict(v) for v in found]}, indent=1))
    else:
        print(render(regime, found))


if __name__ == "__main__":
    main()
