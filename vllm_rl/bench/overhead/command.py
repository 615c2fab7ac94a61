"""What vllm_rl costs the host, per request per step: the RL engine against stock vLLM.

    vllm-rl bench overhead                             # host budgets at 128, 512, 1,024 live
    vllm-rl bench overhead --live 1024 --repeats 5     # the budget point only
    vllm-rl bench overhead --live 128 --repeats 1 --workloads flagless,das   # a quick look
    vllm-rl bench overhead --mode scheduler --live 1024   # the schedulers alone (below)
    vllm-rl bench overhead --mode throughput [...]     # flagless throughput A/B (below)

``--mode host`` (the default, :mod:`vllm_rl.bench.overhead.host`) measures the host time of every
engine step per live request, at several live-sequence counts (``--live``, prompts × n,
n = 8), for each workload (``--workloads``: flagless, each technique alone, all four,
with the flags of ``vllm-rl bench step``), on stock vLLM and on the RL engine in the same
run, each in its own process with one in-process engine and H100 scheduler limits, the
two alternating:

* vLLM's schedule+update: stock vLLM's own scheduler class with only the step trace
  (``TraceMixin``), its ``schedule`` and ``update_from_output`` (and
  ``update_draft_token_ids``) each timed by one ``perf_counter_ns`` pair;
* the RL engine's schedule+update: the same calls on the RL scheduler (its hooks
  included), and the model runner's DAS drafter (tree updates included) and ARRoL
  scorer (``vllm_rl.cost.host.WORKER``);

all per request-step over the decode steps with the batch at its target size (prefill
steps apart), medians and min–max over ``--repeats``, beside the issue's budgets:
flagless within stock's noise, flagged schedule+update ≤ 1.25 × vLLM's, DAS drafting
≤ 3 µs per request-step; the ARRoL scorer's time per step and per scored row is reported.
A markdown table on stdout, JSON and a PNG (bars at the largest count) in ``--out``
(``overhead-<time>.json`` / ``.png``), vLLM's logs in ``--out/overhead-vllm-host-*.log``;
figures: :mod:`vllm_rl.bench.overhead.budget`.  Host times are noisy on a shared machine: compare
ratios from the same run, and rerun on a quiet machine for the absolute figures.

``--mode scheduler`` (:mod:`vllm_rl.bench.overhead.scheduler`) times vLLM's ``Scheduler`` and the RL
scheduler alone, stepped on hand-built model outputs (no model, no worker) through whole
rollouts with every early end of each workload: the part of the host time the RL
scheduler adds to vLLM's, steady to a few percent even on a shared machine.

``--mode throughput`` (:mod:`vllm_rl.bench.overhead.throughput`) is the earlier benchmark: generated
tokens per second of a flagless rollout on the RL engine over stock's, wall and CPU time,
optionally under cProfile (``--profile``), with control engines (``--baseline``,
``--candidate``).
"""
from __future__ import annotations

import argparse

from vllm_rl.bench.overhead.host import WORKLOADS
from vllm_rl.bench.overhead.throughput import ENGINES

# per-mode defaults of the options both modes take
DEFAULTS = {"host": {"repeats": 3, "max_tokens": 96, "max_model_len": 1024},
            "scheduler": {"repeats": 3, "max_tokens": 256, "max_model_len": 1024},
            "throughput": {"repeats": 5, "max_tokens": 256, "max_model_len": 512}}


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="vllm-rl bench overhead",
                                 description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=("host", "scheduler", "throughput"), default="host",
                    help="host: µs per request-step vs the budgets (default); scheduler: "
                         "the schedulers alone on hand-built outputs; throughput: flagless "
                         "tokens/s A/B")
    ap.add_argument("--repeats", type=int, default=None,
                    help="interleaved repeats (default: host 3, scheduler 3, throughput 5)")
    ap.add_argument("--n", type=int, default=8, help="samples per prompt (default 8)")
    ap.add_argument("--max-tokens", type=int, default=None,
                    help="default: host 96, throughput 256")
    ap.add_argument("--max-model-len", type=int, default=None,
                    help="default: host 1024, throughput 512")
    ap.add_argument("--seed", type=int, default=11)
    from vllm_rl.task.kits import add_argument as add_task_argument

    add_task_argument(ap)
    ap.add_argument("--threads", type=int, default=1,
                    help="OMP_NUM_THREADS of each engine (0: torch's default). With one "
                         "compute thread the CPU time is the work done, not spin-waits")
    ap.add_argument("--out", default="bench-results")
    host = ap.add_argument_group("--mode host")
    host.add_argument("--live", default="128,512,1024",
                      help="live-sequence counts, comma-separated: prompts × n "
                           "(default 128,512,1024)")
    host.add_argument("--workloads", default=",".join(WORKLOADS),
                      help=f"comma-separated, among {', '.join(WORKLOADS)} (default all)")
    host.add_argument("--min-tokens", type=int, default=48,
                      help="min_tokens of every request: holds the batch at its size over "
                           "the measured window (default 48)")
    host.add_argument("--live-floor", type=float, default=0.9,
                      help="measured decode steps have at least this × the target live "
                           "(default 0.9)")
    host.add_argument("--skip", type=int, default=2,
                      help="first decode steps left out as warm-up (default 2)")
    host.add_argument("--outlier", type=float, default=10.0,
                      help="leave out of schedule+update (and drafter) a step above this × "
                           "the run's median per request: a descheduled process on a shared "
                           "machine; the scorer is never filtered (default 10; 0: off)")
    host.add_argument("--l-detect", type=int, default=24, help="ARRoL's l_detect (default 24)")
    host.add_argument("--kv-gib", type=float, default=2.0,
                      help="KV cache per engine, GiB (default 2: 1,024 sequences)")
    host.add_argument("--cost", default="h100:qwen3-8b",
                      help="the step-cost table the DAS engine plans with (as bench step)")
    host.add_argument("--das-host", type=int, default=0, metavar="STEPS",
                      help="also time the DAS drafter alone (vllm_rl.bench.overhead.das_drafter.measure, "
                           "no engine) over STEPS steps at each live count (default 0: off)")
    host.add_argument("--model", default=None, help="model path (default: the embedded model)")
    tp = ap.add_argument_group("--mode throughput")
    tp.add_argument("--prompts", type=int, default=64)
    tp.add_argument("--profile", action="store_true",
                    help="one more rollout per engine under cProfile")
    tp.add_argument("--baseline", default="stock", choices=ENGINES,
                    help="the engine compared against (default: stock vLLM, no vllm_rl)")
    tp.add_argument("--candidate", default="rl", choices=ENGINES,
                    help="the engine measured (default: vllm_rl.LLM, flagless requests)")
    return ap


def main(argv: list[str] | None = None) -> dict:
    args = parser().parse_args(argv)
    for key, value in DEFAULTS[args.mode].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.mode == "throughput":
        from vllm_rl.bench.overhead.throughput import run
    elif args.mode == "scheduler":
        from vllm_rl.bench.overhead.scheduler import run
    else:
        from vllm_rl.bench.overhead.host import run
    return run(args)


__all__ = ["DEFAULTS", "main", "parser"]
