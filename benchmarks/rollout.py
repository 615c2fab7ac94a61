"""Rollout benchmark: one RL rollout step over the held-out prompts, RL techniques vs stock vLLM.

This is the full matrix (``vllm-rl bench --full`` runs it); ``vllm-rl bench`` is the quick
one (:mod:`vllm_rl.bench.quick`: every technique alone and combined, in minutes).

    python benchmarks/rollout.py                       # all configurations, embedded model
    python benchmarks/rollout.py --configs darts-shortest --repeats 3 --model PATH
    python benchmarks/rollout.py --suite das           # only the DAS epochs (das_rollout.py)
    python benchmarks/rollout.py --suite arrol         # only ARRoL (arrol.py)

The ``step`` suite (below) times one rollout step of DARTS and DUET; the ``das`` suite
(:mod:`das_rollout`) runs several epochs of DAS against stock vLLM and vLLM's own
speculative methods, since a drafter built from past rollouts needs past rollouts.
The ``arrol`` suite (:mod:`arrol`) trains ARRoL's quality head from the engine's hidden
states, reports its signal at ``l_detect`` and one rollout step with pruning.
``--suite all`` (the default) runs the three, one after the other.  With ``--project`` the
step suite runs its engines in-process with the step trace, and each row also gives the
projected H100 time of the same steps (a projection; its CPU wall times are those of
in-process engines, not comparable with the default, multiprocess run's).

Two engines live in the one process: stock vLLM (its own scheduler) and the RL engine.
Each configuration runs on the same prompts with the same seeds, and the runs are
interleaved (stock, RL, stock, RL, ...) so machine drift falls on both alike.  Both are
driven by the same step loop, which records when each group completes.  The table gives
wall time, generated tokens, engine steps, tokens per second, group completion
percentiles, the mean reward of the training group, and the wall-time ratio to the stock
baseline named in the configuration; the JSON file has every run.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for _p in (ROOT, ROOT / "benchmarks"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))


# The measuring core lives in the package (``vllm-rl bench`` runs on it too).
from vllm_rl.bench.step import (COLUMNS, TASK_MARKER, Config, Run, configs,  # noqa: E402,F401
                                duet_thresholds, interleave as _interleave, print_table,
                                run_once, summarize)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="model path (default: the embedded model)")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--m", type=int, default=8, help="training group size M")
    ap.add_argument("--m-prime", type=int, default=16, help="redundant samples M'")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--configs", default="all",
                    help="comma-separated RL configurations (stock baselines always run)")
    ap.add_argument("--out", default=str(ROOT / "bench-results"))
    ap.add_argument("--suite", choices=("all", "step", "das", "arrol"), default="all")
    ap.add_argument("--project", action="store_true",
                    help="step suite: in-process engines with the step trace, and the "
                         "projected H100 time of each run (benchmarks/gpu_step.py does this "
                         "on the H100's scheduler limits)")
    ap.add_argument("--epochs", type=int, default=3, help="das suite: epochs")
    ap.add_argument("--das-configs", default=None, help="das suite: configurations")
    ap.add_argument("--das-multiprocess", action="store_true",
                    help="das suite: vLLM's multiprocess engines (default: in-process)")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    __import__("quiet").quiet_vllm(args.out)         # vLLM's log lines to a file
    if args.suite in ("all", "step"):
        step_suite(args, ap)
    if args.suite in ("all", "das"):
        import das_rollout

        das_rollout.main(
            ([f"--model={args.model}"] if args.model else [])
            + [f"--prompts={args.prompts}", f"--m={args.m}", f"--epochs={args.epochs}",
               f"--max-tokens={args.max_tokens}", f"--seed={args.seed}", f"--out={args.out}"]
            + ([f"--configs={args.das_configs}"] if args.das_configs else [])
            + (["--multiprocess"] if args.das_multiprocess else []))
    if args.suite in ("all", "arrol"):
        import arrol

        arrol.main(([f"--model={args.model}"] if args.model else [])
                   + [f"--max-tokens={args.max_tokens}", f"--seed={args.seed}",
                      f"--out={args.out}"])


def step_suite(args, ap) -> None:
    """DARTS and DUET against stock vLLM: one rollout step, interleaved repeats."""
    import vllm
    from tqdm import tqdm

    from vllm_rl.cost import load_cost
    from vllm_rl.engine.trace import CONFIG_KEY as TRACE_KEY, TRACED_SCHEDULER_CLS
    from vllm_rl.llm import LLM, CPU_KV_CACHE_BYTES
    from vllm_rl.task import MODEL_PATH, heldout_prompts

    model = args.model or str(MODEL_PATH)
    common = dict(seed=args.seed, max_model_len=1024)
    cost, traced = None, {}
    if args.project:        # the step trace lives in the engine core: in-process engines
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        cost = load_cost("h100:qwen3-8b")
        traced = {"scheduler_cls": TRACED_SCHEDULER_CLS, "additional_config": {TRACE_KEY: True}}
    engines = {"stock": vllm.LLM(model, async_scheduling=True,
                                 kv_cache_memory_bytes=CPU_KV_CACHE_BYTES, **traced, **common),
               "rl": LLM(model, trace=bool(traced), **common)}
    prompts = heldout_prompts(args.prompts)
    duet = duet_thresholds(engines["rl"], prompts, args.max_tokens, args.seed + 1000)
    cfgs = configs(args.m, args.m_prime, duet)
    wanted = [c for c in cfgs.values() if c.engine == "rl"]
    if args.configs != "all":
        names = args.configs.split(",")
        unknown = set(names) - set(cfgs)
        if unknown:
            ap.error(f"unknown configuration(s) {sorted(unknown)}; choose from {sorted(cfgs)}")
        wanted = [cfgs[n] for n in names if cfgs[n].engine == "rl"]
    stocks = [c for c in cfgs.values() if c.engine == "stock"]
    # Warm both engines up with the same small job, outside the timings.
    for llm in engines.values():
        llm.generate(prompts[:4], vllm.SamplingParams(n=2, max_tokens=16), use_tqdm=False)

    # Interleave: every repeat runs every configuration, stock ones between RL ones.
    plan = [(c, rep) for rep in range(args.repeats) for c in _interleave(stocks, wanted)]
    runs = []
    for cfg, rep in tqdm(plan, desc="rollout steps", unit="run"):
        runs.append(run_once(engines[cfg.engine], cfg, prompts, args.m, args.seed,
                             args.max_tokens, rep, cost))
    rows = summarize(runs, cfgs)
    print(f"\nmodel {model}; {len(prompts)} prompts; M={args.m}, M'={args.m_prime}; "
          f"max_tokens {args.max_tokens}; median of {args.repeats} interleaved repeats"
          + ("; engines in-process; 'H100 8B ms' is a PROJECTION: the same engine steps "
             "priced on the H100 step-cost table (CPU scheduler limits; benchmarks/gpu_step.py "
             "uses the H100's)" if args.project else ""))
    print(f"duet flags: {duet}")
    print_table(rows)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"rollout-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps({"args": vars(args), "model": model, "duet": duet, "summary": rows,
                                "runs": [asdict(r) for r in runs]}, indent=2))
    print(f"\nwrote {path}")
    for llm in engines.values():       # free the cores before another suite starts
        llm.llm_engine.engine_core.shutdown()


if __name__ == "__main__":
    main()
