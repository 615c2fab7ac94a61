"""``vllm-rl bench``: the offline rollout benchmark (this project's main job).

By default the quick run (:mod:`vllm_rl.bench.quick`): every technique alone and all
four combined against stock vLLM, in the same run, in a few minutes on 2 CPU cores.
``--full`` runs the whole matrix of ``benchmarks/rollout.py`` (step, DAS and ARRoL
suites; tens of minutes), which needs a source checkout.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

DESCRIPTION = ("The offline rollout benchmark: one RL rollout step on the held-out prompts "
               "with each technique (DARTS, DUET, DAS, ARRoL) alone and all combined, "
               "against stock vLLM in the same run (interleaved).  Prints a table with CPU "
               "wall time and the step's projected H100 time; writes JSON and PNGs (length "
               "CDF, running requests over the step) to --out; vLLM's log goes to "
               "OUT/vllm.log.")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="vllm-rl bench", description=DESCRIPTION)
    ap.add_argument("--full", action="store_true",
                    help="the whole matrix instead: benchmarks/rollout.py (step, DAS and "
                         "ARRoL suites, ~30+ min on 2 cores; needs the source checkout); "
                         "arguments after --full go to it")
    ap.add_argument("--model", default=None, help="model path (default: the embedded model)")
    ap.add_argument("--prompts", type=int, default=16, help="held-out prompts (default 16)")
    ap.add_argument("--m", type=int, default=8, help="training group size M (default 8)")
    ap.add_argument("--m-prime", type=int, default=16,
                    help="samples generated per prompt with DARTS redundancy, M' (default 16)")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--l-detect", type=int, default=16,
                    help="ARRoL: tokens at which a sample is scored (default 16)")
    ap.add_argument("--repeats", type=int, default=1,
                    help="interleaved repeats; the table gives medians (default 1; the "
                         "projected H100 column is the same engine steps each time, the CPU "
                         "wall varies with the machine's load)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--configs", default="all",
                    help="comma-separated technique configurations among darts, duet, das, "
                         "arrol, all (stock baselines always run)")
    ap.add_argument("--cost", default="h100:qwen3-8b",
                    help="step-cost table for the projected GPU column and the DAS cost cap "
                         "(vllm_rl.cost.load_cost; default h100:qwen3-8b)")
    ap.add_argument("--out", default="bench-results",
                    help="folder for the JSON, PNGs and vllm.log (default ./bench-results)")
    return ap


def full(argv: list[str]) -> None:
    """``benchmarks/rollout.py`` of the checkout this package was installed from."""
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "rollout.py"
    if not script.exists():
        sys.exit("vllm-rl bench --full runs benchmarks/rollout.py from the source checkout, "
                 f"and none is beside this installation ({script} is missing); install "
                 "vllm-rl from a checkout (pip install -e .) or run the quick benchmark")
    import runpy

    sys.argv = [str(script), *argv]
    runpy.run_path(str(script), run_name="__main__")


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "train":
        from vllm_rl.bench import train

        train.main(argv[1:])
        return
    if "--full" in argv:
        i = argv.index("--full")
        full(argv[:i] + argv[i + 1:])
        return
    args = parser().parse_args(argv)
    from vllm_rl.bench import quick          # vLLM is imported inside quick.main, later

    unknown = set(args.configs.split(",")) - {"all", *quick.TECHNIQUES}
    if unknown:
        parser().error(f"unknown configuration(s) {sorted(unknown)}; choose from "
                       f"{', '.join(quick.TECHNIQUES)}")
    quick.main(args)
