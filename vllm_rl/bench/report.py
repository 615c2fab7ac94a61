"""``vllm-rl bench report FILE.json``: a benchmark's markdown table again, from its JSON.

The tables in ``docs/benchmarks.md`` are written this way, from the JSON files kept in
``docs/results/``: ``step-*.json`` (``vllm-rl bench step``) and ``train.json``
(``vllm-rl bench train``).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def render(doc: dict) -> str:
    if "runs" in doc and doc["runs"] and "heldout_start" in doc["runs"][0]:
        from vllm_rl.bench.train import report as train_report
        from vllm_rl.bench.train.budget import reprice

        reprice(doc["runs"])
        summary = train_report.summarize(doc["runs"])
        parts = [train_report.table(summary)]
        for title, text in (("Speed-up at equal accuracy (geometric mean over seeds, 95% "
                             "t-interval on the log scale)", train_report.speedup_table(summary)),
                            ("At stock's final mean, on every axis",
                             train_report.axes_table(summary)),
                            ("Per seed, at stock's final mean", train_report.seeds_table(summary)),
                            ("Where each configuration's end-to-end time goes",
                             train_report.parts_table(doc["runs"]))):
            if text:
                parts.append(f"{title}:\n\n{text}")
        return "\n\n".join(parts)
    if "summary" in doc and isinstance(doc["summary"], list):
        from vllm_rl.bench.step import report as step

        base = f"stock-{doc['args']['m']}"
        return step.table(doc["summary"], base)
    raise ValueError("not a `vllm-rl bench step` or `vllm-rl bench train` JSON file")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="vllm-rl bench report", description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", help="JSON files written by `vllm-rl bench step|train`")
    args = ap.parse_args(argv)
    for path in args.files:
        print(f"\n{path}\n")
        print(render(json.loads(Path(path).read_text())))
