"""One rollout step on an engine's step loop: the measuring core of the rollout benchmarks.

A :class:`Config` says how one configuration produces its training groups (engine kind,
samples per prompt, flags); :func:`run_once` drives an ``LLM``'s step loop over one rollout
step and returns a :class:`Run` (wall, tokens, engine steps, group completion times, the
training group's reward and length, the techniques' counts, and with a step trace the
projected GPU time and the batch over the step); :func:`summarize` takes medians over
repeats and ratios to the stock baselines.  ``vllm-rl bench`` (:mod:`vllm_rl.bench.quick`)
and ``benchmarks/rollout.py`` both run on it.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Callable


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
    samples: int = 0                 # completions returned (all n of every prompt)
    kept_weight: float = 0.0         # sum of the training group's loss weights
    draft_proposed: int = 0          # DAS: draft tokens verified
    draft_accepted: int = 0          # DAS: draft tokens the model accepted
    arrol_pruned: int = 0            # ARRoL: samples pruned at l_detect
    lengths: list[int] = field(default_factory=list)        # every sample's length
    kept_lengths: list[int] = field(default_factory=list)   # the training group's
    batch_profile: list[int] = field(default_factory=list)  # sequences per engine step (trace)
    step_wall_ms: list[float] = field(default_factory=list)  # each step's CPU wall (trace)


def run_once(llm, cfg: Config, prompts: list[str], m: int, seed: int, max_tokens: int,
             repeat: int, cost=None) -> Run:
    """Drive the engine's step loop over one rollout step; time each group's completion.

    With ``cost`` (a :class:`vllm_rl.cost.StepCost`) the engine must be in-process with the
    step trace on: the run's steps are priced with it, and the batch of each step kept."""
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
    step_trace = trace.since(mark) if trace is not None else None
    projected = step_trace.project(cost).total_ms if step_trace is not None else 0.0
    attach_rollout_info(outputs, [params] * len(outputs))
    tokens = sum(len(c.token_ids) for o in outputs for c in o.outputs)
    kept, reasons, eps_kept, weight, lengths, proposed, accepted = [], {}, 0, 0.0, [], 0, 0
    for prompt, out in zip(prompts, outputs):
        for c in out.outputs:
            info = c.rollout_info
            reasons[info.reason.value] = reasons.get(info.reason.value, 0) + 1
            eps_kept += info.weight > 1.0
            lengths.append(len(c.token_ids))
            proposed += info.draft_proposed or 0
            accepted += info.draft_accepted or 0
            if info.weight > 0:           # in the training group (stock: every sample)
                kept.append((reward(prompt, c.text), len(c.token_ids)))
                weight += info.weight
    n_samples = len(lengths)
    times = sorted(done.values())
    q = statistics.quantiles(times, n=10, method="inclusive") if len(times) > 1 else times * 9
    return Run(cfg.name, repeat, wall, tokens, steps, tokens / wall, statistics.median(times),
               q[8], times[-1], len(kept),
               statistics.mean(r for r, _ in kept) if kept else 0.0,
               statistics.mean(n for _, n in kept) if kept else 0.0, projected,
               reasons.get("duet_aborted", 0) / n_samples, eps_kept / n_samples, reasons,
               n_samples, weight, proposed, accepted, reasons.get("arrol_pruned", 0),
               lengths, [n for _, n in kept],
               [len(w) for w, _ in step_trace.steps()] if step_trace is not None else [],
               list(step_trace.wall_ms) if step_trace is not None else [])


MEDIAN_KEYS = ("wall_s", "generated_tokens", "engine_steps", "tokens_per_s", "group_done_p50_s",
               "group_done_p90_s", "group_done_max_s", "kept_samples", "kept_mean_reward",
               "kept_mean_length", "projected_ms", "aborted_share", "eps_kept_share",
               "draft_proposed", "draft_accepted", "arrol_pruned", "samples")


def summarize(runs: list[Run], cfgs: dict[str, Config]) -> list[dict]:
    by: dict[str, list[Run]] = {}
    for r in runs:
        by.setdefault(r.config, []).append(r)
    med = {name: {k: statistics.median(getattr(r, k) for r in rs) for k in MEDIAN_KEYS}
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


def interleave(stocks: list[Config], rls: list[Config]) -> list[Config]:
    out = []
    for i in range(max(len(stocks), len(rls))):
        out += stocks[i:i + 1] + rls[i:i + 1]
    return out


