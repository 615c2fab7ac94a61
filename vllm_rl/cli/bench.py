"""``vllm-rl bench``: the benchmarks, one harness (:mod:`vllm_rl.bench`).

    vllm-rl bench                    # the main job: ``step`` at its quick defaults
    vllm-rl bench step [...]         # one rollout step per configuration vs stock vLLM
    vllm-rl bench points [...]       # speed-up over stock by batch size (the table)
    vllm-rl bench train [...]        # time to accuracy: GRPO through the engine, seeds
    vllm-rl bench das [...]          # DAS over epochs vs stock, ngram, suffix
    vllm-rl bench das-batch [...]    # drafting's gain by batch size
    vllm-rl bench arrol [...]        # ARRoL's head: signal at l_detect, one pruned step
    vllm-rl bench arrol-gate [...]   # the within-group AUC from which ARRoL's steering helps
    vllm-rl bench duet-gate [...]    # DUET's gate in the model's regime, its baseline's shift
    vllm-rl bench regime [...]       # each kit's regime beside the papers', each gate's verdict
    vllm-rl bench overhead [...]     # host µs per request-step vs stock vLLM, vs budgets
    vllm-rl bench host-parts [...]   # each engine's host time per step, part by part
    vllm-rl bench report FILE.json   # a benchmark's table again, from its JSON

Each subcommand has its own ``--help``.  Everything runs from the installed package.
"""
from __future__ import annotations

import importlib
import sys

SUBCOMMANDS = {   # name -> (module, one line of help)
    "step": ("vllm_rl.bench.step.command", "one rollout step per configuration (each technique, all "
             "four) vs stock vLLM: tokens, steps, training group, diagnostics, CPU and "
             "projected GPU time, without and with the host time"),
    "points": ("vllm_rl.bench.points", "the operating-point table: speed-up over stock by "
               "batch size (one step run per size and seed), host-counted and GPU-only, "
               "JSON and PNG"),
    "train": ("vllm_rl.bench.train.command", "time to accuracy end to end (rollout, trainer and "
              "weight sync): TRL GRPO on the embedded model through the engine, stock vs "
              "the configurations asked, several seeds"),
    "das": ("vllm_rl.bench.das", "DAS over several epochs vs stock vLLM and vLLM's ngram "
            "and suffix drafters"),
    "das-batch": ("vllm_rl.bench.das_batch", "DAS drafting's throughput gain by batch size "
                  "(the batch cap's defaults)"),
    "arrol": ("vllm_rl.bench.arrol", "ARRoL's quality head: its signal at each l_detect "
              "(hidden state, trace features, both), then one step with pruning"),
    "arrol-gate": ("vllm_rl.bench.arrol_gate", "the within-group AUC from which ARRoL's "
                   "steering brings groups closer to rho than stock (what the gate tests)"),
    "duet-gate": ("vllm_rl.bench.duet_gate", "DUET's gate in the model's regime beside "
                  "the paper's (marker-less share, length tail, group balance) and what "
                  "its baseline costs, with common random numbers"),
    "regime": ("vllm_rl.bench.regime", "each kit's rollout regime beside the papers' "
               "(marker-less share, tokens after the answer, lengths, rho, groups, the "
               "head's AUC, DAS's acceptance) and what each technique's gate decides"),
    "overhead": ("vllm_rl.bench.overhead.command", "host time per request-step (scheduling, "
                 "update, drafter, scorer) at up to 1,024 live sequences, RL engine vs "
                 "stock vLLM, against the budgets (--mode throughput: flagless tokens/s)"),
    "host-parts": ("vllm_rl.bench.host_parts", "where stock vLLM's and the DAS engine's host "
                   "time goes per engine step, part by part, by phase, beside the forward "
                   "pass's price"),
    "report": ("vllm_rl.bench.report", "a benchmark's markdown table again, from its JSON"),
}


def usage() -> str:
    width = max(map(len, SUBCOMMANDS))
    lines = [f"  {name.ljust(width)}  {text}" for name, (_, text) in SUBCOMMANDS.items()]
    return (__doc__.split("\n\n")[0] + "\n\nusage: vllm-rl bench [SUBCOMMAND] [options]\n\n"
            "subcommands (default: step at its quick defaults):\n" + "\n".join(lines) +
            "\n\n`vllm-rl bench SUBCOMMAND --help` describes each one's options.")


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("-h", "--help", "help"):
        print(usage())
        return
    if argv and argv[0] in SUBCOMMANDS:
        name, rest = argv[0], argv[1:]
    elif argv and not argv[0].startswith("-"):
        print(usage(), file=sys.stderr)
        sys.exit(f"vllm-rl bench: unknown subcommand {argv[0]!r}; choose from "
                 f"{', '.join(SUBCOMMANDS)}")
    else:
        name, rest = "step", argv
    module = importlib.import_module(SUBCOMMANDS[name][0])
    prog = f"vllm-rl bench {name}"
    if name == "step":
        module.main(rest, prog="vllm-rl bench" if not argv or argv[0] != "step" else prog)
    else:
        module.main(rest)
