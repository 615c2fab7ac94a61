"""``vllm-rl``: the command-line entry point (console script ``vllm-rl = vllm_rl.cli:main``).

Each subcommand is a module with its own ``main(argv)``; this module only dispatches, so
``vllm-rl --help`` answers without importing vLLM.
"""
from __future__ import annotations

import sys

SUBCOMMANDS = {   # name -> (module, one line of help)
    "serve": ("vllm_rl.cli.serve",
              "the OpenAI-compatible server on the RL engine (vLLM's `serve`; every vllm "
              "serve option works; --das, --arrol, --stock)"),
    "bench": ("vllm_rl.cli.bench",
              "the benchmarks: one rollout step per technique vs stock vLLM (the default, "
              "minutes), time to accuracy (train), das, das-batch, arrol, overhead"),
    "advise": ("vllm_rl.cli.advise",
               "which techniques to switch on, from a drop-in's regime log of your own "
               "rollouts: the regime's statistics, each gate's decision, the row it rests on"),
    "serve-bench": ("vllm_rl.bench.serve",
                    "RL-shaped load (N prompts x M samples) against a running server, this "
                    "project's or stock vLLM's; latency, group and step metrics as JSON + PNGs"),
}

HELP = """usage: vllm-rl <command> [options]

vLLM for RL rollouts: DARTS, DUET, DAS and ARRoL inside vLLM's engine, switched on per
request by sampling flags (SamplingParams.extra_args["vllm_rl"], or vllm_xargs on the server).

commands:
{commands}

`vllm-rl <command> --help` describes each one.  Examples:

  vllm-rl bench                              # the main job: every technique vs stock vLLM
  vllm-rl bench train --quick                # time to accuracy, a smoke run
  vllm-rl serve --das --arrol --port 8000    # the server, embedded model, all techniques
  vllm-rl serve --stock --port 8001          # plain vLLM serve from the same install
  vllm-rl serve-bench --base-url http://localhost:8000 --techniques darts,duet
  vllm-rl advise regime.jsonl                # which techniques pay on your rollouts
"""


def usage() -> str:
    import textwrap

    width = max(map(len, SUBCOMMANDS))
    indent = " " * (width + 4)
    return HELP.format(commands="\n".join(
        textwrap.fill(text, 88, initial_indent=f"  {name.ljust(width)}  ",
                      subsequent_indent=indent) for name, (_, text) in SUBCOMMANDS.items()))


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    if argv[0] in ("-V", "--version"):
        from vllm_rl import __version__

        print(f"vllm-rl {__version__}")
        return 0
    if argv[0] not in SUBCOMMANDS:
        print(usage(), file=sys.stderr)
        print(f"vllm-rl: unknown command {argv[0]!r}; choose from {', '.join(SUBCOMMANDS)}",
              file=sys.stderr)
        return 2
    import importlib

    module = importlib.import_module(SUBCOMMANDS[argv[0]][0])
    sys.argv = [f"vllm-rl {argv[0]}", *argv[1:]]
    module.main(argv[1:])
    return 0
