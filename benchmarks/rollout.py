"""Rollout benchmark: one RL rollout step over the held-out prompts, RL techniques vs stock vLLM.

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
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
for _p in (ROOT, ROOT / "benchmarks"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))


@dataclass(frozen=True)
class Config:
    """One way of producing the training groups of a step."""

    name: str
    engine: str                 # "stock" or "rl"
    n: int                      # samples generated per prompt (M or M')
    keep: int                   # samples per prompt that enter training (M)
    flags: Callable[[int, int], dict] | None = None   # (M, M') -> extra_args
    baseline: str | None = None  # the stock configuration it is compared with


# DUET's answer marker for the embedded task: its completions end "\boxed{ N }" and EOS,
# with no blank line after the box, so the built-in math marker would never fire.
TASK_MARKER = r"\\boxed\{[^}]*\}"


def configs(m: int, m_prime: int, duet_flags: dict | None = None) -> dict[str, Config]:
    from vllm_rl import rl_params

    def darts(mode: str):
        return lambda mm, mp: rl_params(group={"size": mm}, darts={"mode": mode})

    stock_big, stock_small = f"stock-{m_prime}", f"stock-{m}"
    cfgs = [
        Config(stock_big, "stock", m_prime, m_prime),
        Config(stock_small, "stock", m, m),
        Config("darts-shortest", "rl", m_prime, m, darts("shortest"), stock_big),
        Config("darts-dual-end", "rl", m_prime, m, darts("dual_end"), stock_big),
    ]
    if duet_flags is not None:
        cfgs.append(Config("duet", "rl", m, m, lambda mm, mp: rl_params(duet=duet_flags),
                           stock_small))
    return {c.name: c for c in cfgs}


def duet_thresholds(llm, prompts: list[str], max_tokens: int, seed: int) -> dict:
    """DUET flags as a trainer would send them: K1 = p30 and K2 = p80 of the kept lengths
    of a previous step (here an untimed calibration step, App. A.3), and G = 150 scaled
    from the paper's 3072-token limit to this one."""
    from vllm import SamplingParams

    from vllm_rl.control.duet import percentile

    outs = llm.generate(prompts, SamplingParams(n=4, temperature=1.0, max_tokens=max_tokens,
                                                seed=seed), use_tqdm=False)
    lengths = [len(c.token_ids) for o in outs for c in o.outputs if c.finish_reason == "stop"]
    return {"k1": round(percentile(lengths, 30)), "k2": round(percentile(lengths, 80)),
            "grace": max(1, round(150 * max_tokens / 3072)),
            "eps": 0.05, "pattern": TASK_MARKER}


@dataclass
class Run:
    config: str
    repeat: int
    wall_s: float
    generated_tokens: int
    engine_steps: int
    tokens_per_s: float
    group_done_p50_s: float
    group_done_p90_s: float
    group_done_max_s: float
    kept_samples: int
    kept_mean_reward: float
    kept_mean_length: float
    projected_ms: float = 0.0        # the same engine steps priced on the H100 8B table
    aborted_share: float = 0.0       # DUET: aborted at the gate
    eps_kept_share: float = 0.0      # DUET: kept by the coin, weight 1/eps
    reasons: dict[str, int] = field(default_factory=dict)


def run_once(llm, cfg: Config, prompts: list[str], m: int, seed: int, max_tokens: int,
             repeat: int, cost=None) -> Run:
    """Drive the engine's step loop over one rollout step; time each group's completion."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    from vllm_rl.engine.trace import engine_trace
    from vllm_rl.llm import attach_rollout_info
    from vllm_rl.task import reward

    extra = cfg.flags(m, cfg.n) if cfg.flags else None
    params = SamplingParams(n=cfg.n, temperature=1.0, max_tokens=max_tokens, seed=seed,
                            extra_args=extra, output_kind=RequestOutputKind.FINAL_ONLY)
    engine = llm.llm_engine
    trace = engine_trace(llm) if cost is not None else None
    mark = trace.mark() if trace is not None else 0
    t0 = time.perf_counter()
    ids = {}
    for i, prompt in enumerate(prompts):
        rid = f"{cfg.name}-{repeat}-{i}"
        ids[rid] = i
        engine.add_request(rid, prompt, params)
    done: dict[int, float] = {}
    outputs = [None] * len(prompts)
    steps = 0   # the engine core sends one batch of outputs per engine step
    while engine.has_unfinished_requests():
        steps += 1
        for out in engine.step():
            if out.finished:  # FINAL_ONLY: one output per request, all n samples in it
                i = ids[out.request_id]
                outputs[i] = out
                done[i] = time.perf_counter() - t0
    wall = time.perf_counter() - t0
    projected = trace.since(mark).project(cost).total_ms if trace is not None else 0.0
    attach_rollout_info(outputs, [params] * len(outputs))
    tokens = sum(len(c.token_ids) for o in outputs for c in o.outputs)
    kept, reasons, eps_kept = [], {}, 0
    for prompt, out in zip(prompts, outputs):
        for c in out.outputs:
            info = c.rollout_info
            reasons[info.reason.value] = reasons.get(info.reason.value, 0) + 1
            eps_kept += info.weight > 1.0
            if info.weight > 0:           # in the training group (stock: every sample)
                kept.append((reward(prompt, c.text), len(c.token_ids)))
    n_samples = sum(len(o.outputs) for o in outputs)
    times = sorted(done.values())
    q = statistics.quantiles(times, n=10, method="inclusive") if len(times) > 1 else times * 9
    return Run(cfg.name, repeat, wall, tokens, steps, tokens / wall, statistics.median(times),
               q[8], times[-1], len(kept), statistics.mean(r for r, _ in kept),
               statistics.mean(n for _, n in kept), projected,
               reasons.get("duet_aborted", 0) / n_samples, eps_kept / n_samples, reasons)


def summarize(runs: list[Run], cfgs: dict[str, Config]) -> list[dict]:
    by: dict[str, list[Run]] = {}
    for r in runs:
        by.setdefault(r.config, []).append(r)
    med = {name: {k: statistics.median(getattr(r, k) for r in rs)
                  for k in ("wall_s", "generated_tokens", "engine_steps", "tokens_per_s",
                            "group_done_p50_s", "group_done_p90_s", "group_done_max_s",
                            "kept_mean_reward", "kept_mean_length", "projected_ms",
                            "aborted_share",
                            "eps_kept_share")}
           for name, rs in by.items()}
    rows = []
    for name, s in med.items():
        base = cfgs[name].baseline
        row = {"config": name, **s, "repeats": len(by[name])}
        for stock in [base] + [c for c in med if cfgs[c].engine == "stock" and c != base]:
            if stock and stock in med:
                row[f"wall_vs_{stock}"] = s["wall_s"] / med[stock]["wall_s"]
                if s["projected_ms"]:
                    row[f"h100_vs_{stock}"] = med[stock]["projected_ms"] / s["projected_ms"]
                row[f"tokens_vs_{stock}"] = s["generated_tokens"] / med[stock]["generated_tokens"]
        rows.append(row)
    return rows


COLUMNS = [  # (key, header, format)
    ("config", "config", "{}"), ("wall_s", "wall s", "{:.2f}"),
    ("generated_tokens", "tokens", "{:.0f}"), ("engine_steps", "steps", "{:.0f}"),
    ("tokens_per_s", "tok/s", "{:.0f}"), ("group_done_p50_s", "grp p50 s", "{:.2f}"),
    ("group_done_p90_s", "grp p90 s", "{:.2f}"), ("group_done_max_s", "grp max s", "{:.2f}"),
    ("kept_mean_reward", "kept reward", "{:.3f}"), ("kept_mean_length", "kept len", "{:.1f}"),
    ("projected_ms", "H100 8B ms (proj., --project)", "{:.0f}"),
    ("aborted_share", "aborted", "{:.3f}"), ("eps_kept_share", "eps-kept", "{:.3f}"),
]


def print_table(rows: list[dict]) -> None:
    ratios = sorted({k for r in rows for k in r
                     if k.startswith(("wall_vs_", "tokens_vs_", "h100_vs_"))})
    cols = [c for c in COLUMNS if c[0] != "projected_ms"
            or any(r.get("projected_ms") for r in rows)] + [(k, k, "{:.3f}") for k in ratios]
    cells = [[h for _, h, _ in cols]]
    cells += [[fmt.format(r[k]) if k in r else "" for k, _, fmt in cols] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(cols))]
    for row in cells:
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                        for i, (c, w) in enumerate(zip(row, widths))))


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


def _interleave(stocks: list[Config], rls: list[Config]) -> list[Config]:
    out = []
    for i in range(max(len(stocks), len(rls))):
        out += stocks[i:i + 1] + rls[i:i + 1]
    return out


if __name__ == "__main__":
    main()
