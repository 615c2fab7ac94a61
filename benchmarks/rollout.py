"""Rollout benchmark: one RL rollout step over the held-out prompts, RL techniques vs stock vLLM.

    python benchmarks/rollout.py                       # all configurations, embedded model
    python benchmarks/rollout.py --configs darts-shortest --repeats 3 --model PATH

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
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


@dataclass(frozen=True)
class Config:
    """One way of producing the training groups of a step."""

    name: str
    engine: str                 # "stock" or "rl"
    n: int                      # samples generated per prompt (M or M')
    keep: int                   # samples per prompt that enter training (M)
    flags: Callable[[int, int], dict] | None = None   # (M, M') -> extra_args
    baseline: str | None = None  # the stock configuration it is compared with


def configs(m: int, m_prime: int) -> dict[str, Config]:
    from vllm_rl import rl_params

    def darts(mode: str):
        return lambda mm, mp: rl_params(group={"size": mm}, darts={"mode": mode})

    stock_big, stock_small = f"stock-{m_prime}", f"stock-{m}"
    return {c.name: c for c in (
        Config(stock_big, "stock", m_prime, m_prime),
        Config(stock_small, "stock", m, m),
        Config("darts-shortest", "rl", m_prime, m, darts("shortest"), stock_big),
        Config("darts-dual-end", "rl", m_prime, m, darts("dual_end"), stock_big),
    )}


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
    reasons: dict[str, int] = field(default_factory=dict)


def _engine_steps(llm) -> int:
    for metric in llm.get_metrics():
        if metric.name == "vllm:iteration_tokens_total":
            return int(metric.count)
    return 0


def run_once(llm, cfg: Config, prompts: list[str], m: int, seed: int, max_tokens: int,
             repeat: int) -> Run:
    """Drive the engine's step loop over one rollout step; time each group's completion."""
    from vllm import SamplingParams

    from vllm_rl.llm import attach_rollout_info
    from vllm_rl.task import reward

    extra = cfg.flags(m, cfg.n) if cfg.flags else None
    params = SamplingParams(n=cfg.n, temperature=1.0, max_tokens=max_tokens, seed=seed,
                            extra_args=extra)
    engine = llm.llm_engine
    steps0 = _engine_steps(llm)
    t0 = time.perf_counter()
    ids = {}
    for i, prompt in enumerate(prompts):
        rid = f"{cfg.name}-{repeat}-{i}"
        ids[rid] = i
        engine.add_request(rid, prompt, params)
    done: dict[int, float] = {}
    outputs = [None] * len(prompts)
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                i = ids[out.request_id]
                outputs[i] = out
                done[i] = time.perf_counter() - t0
    wall = time.perf_counter() - t0
    steps = _engine_steps(llm) - steps0
    attach_rollout_info(outputs, [params] * len(outputs))
    tokens = sum(len(c.token_ids) for o in outputs for c in o.outputs)
    kept, reasons = [], {}
    for prompt, out in zip(prompts, outputs):
        for c in out.outputs:
            info = c.rollout_info
            reasons[info.reason.value] = reasons.get(info.reason.value, 0) + 1
            if cfg.flags is None or info.selected:
                kept.append((reward(prompt, c.text), len(c.token_ids)))
    times = sorted(done.values())
    q = statistics.quantiles(times, n=10) if len(times) > 1 else times * 9
    return Run(cfg.name, repeat, wall, tokens, steps, tokens / wall, statistics.median(times),
               q[8], times[-1], len(kept), statistics.mean(r for r, _ in kept),
               statistics.mean(n for _, n in kept), reasons)


def summarize(runs: list[Run], cfgs: dict[str, Config]) -> list[dict]:
    by: dict[str, list[Run]] = {}
    for r in runs:
        by.setdefault(r.config, []).append(r)
    med = {name: {k: statistics.median(getattr(r, k) for r in rs)
                  for k in ("wall_s", "generated_tokens", "engine_steps", "tokens_per_s",
                            "group_done_p50_s", "group_done_p90_s", "group_done_max_s",
                            "kept_mean_reward", "kept_mean_length")}
           for name, rs in by.items()}
    rows = []
    for name, s in med.items():
        base = cfgs[name].baseline
        row = {"config": name, **s, "repeats": len(by[name])}
        for stock in [base] + [c for c in med if cfgs[c].engine == "stock" and c != base]:
            if stock and stock in med:
                row[f"wall_vs_{stock}"] = s["wall_s"] / med[stock]["wall_s"]
                row[f"tokens_vs_{stock}"] = s["generated_tokens"] / med[stock]["generated_tokens"]
        rows.append(row)
    return rows


def print_table(rows: list[dict]) -> None:
    cols = [("config", "{:<16}"), ("wall_s", "{:>7.2f}"), ("generated_tokens", "{:>8.0f}"),
            ("engine_steps", "{:>6.0f}"), ("tokens_per_s", "{:>8.0f}"),
            ("group_done_p50_s", "{:>6.2f}"), ("group_done_p90_s", "{:>6.2f}"),
            ("group_done_max_s", "{:>6.2f}"), ("kept_mean_reward", "{:>6.3f}"),
            ("kept_mean_length", "{:>6.1f}")]
    heads = ["config", "wall s", "tokens", "steps", "tok/s", "p50 s", "p90 s", "max s",
             "reward", "len"]
    ratio_cols = sorted({k for r in rows for k in r if k.startswith(("wall_vs_", "tokens_vs_"))})
    print("  ".join(f"{h:>8}" if i else f"{h:<16}" for i, h in enumerate(heads + ratio_cols)))
    for r in rows:
        cells = [fmt.format(r[k]) for k, fmt in cols]
        cells += [f"{r[k]:>{len(k)}.3f}" if k in r else " " * len(k) for k in ratio_cols]
        print("  ".join(cells))


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
    args = ap.parse_args(argv)

    import vllm
    from tqdm import tqdm

    from vllm_rl.llm import LLM, CPU_KV_CACHE_BYTES
    from vllm_rl.task import MODEL_PATH, heldout_prompts

    model = args.model or str(MODEL_PATH)
    cfgs = configs(args.m, args.m_prime)
    wanted = [c for c in cfgs.values() if c.engine == "rl"]
    if args.configs != "all":
        names = args.configs.split(",")
        unknown = set(names) - set(cfgs)
        if unknown:
            ap.error(f"unknown configuration(s) {sorted(unknown)}; choose from {sorted(cfgs)}")
        wanted = [cfgs[n] for n in names if cfgs[n].engine == "rl"]
    stocks = [c for c in cfgs.values() if c.engine == "stock"]
    common = dict(seed=args.seed, max_model_len=1024, disable_log_stats=False)
    engines = {"stock": vllm.LLM(model, async_scheduling=True,
                                 kv_cache_memory_bytes=CPU_KV_CACHE_BYTES, **common),
               "rl": LLM(model, **common)}
    prompts = heldout_prompts(args.prompts)
    # Warm both engines up with the same small job, outside the timings.
    for llm in engines.values():
        llm.generate(prompts[:4], vllm.SamplingParams(n=2, max_tokens=16), use_tqdm=False)

    # Interleave: every repeat runs every configuration, stock ones between RL ones.
    plan = [(c, rep) for rep in range(args.repeats) for c in _interleave(stocks, wanted)]
    runs = []
    for cfg, rep in tqdm(plan, desc="rollout steps", unit="run"):
        runs.append(run_once(engines[cfg.engine], cfg, prompts, args.m, args.seed,
                             args.max_tokens, rep))
    rows = summarize(runs, cfgs)
    print(f"\nmodel {model}; {len(prompts)} prompts; M={args.m}, M'={args.m_prime}; "
          f"max_tokens {args.max_tokens}; median of {args.repeats} interleaved repeats")
    print_table(rows)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"rollout-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps({"args": vars(args), "model": model, "summary": rows,
                                "runs": [asdict(r) for r in runs]}, indent=2))
    print(f"\nwrote {path}")


def _interleave(stocks: list[Config], rls: list[Config]) -> list[Config]:
    out = []
    for i in range(max(len(stocks), len(rls))):
        out += stocks[i:i + 1] + rls[i:i + 1]
    return out


if __name__ == "__main__":
    main()
