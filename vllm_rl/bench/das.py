"""DAS rollout benchmark: several epochs over the held-out prompts, DAS vs stock vLLM,
vLLM's ``ngram`` and vLLM's ``suffix`` (Arctic Inference) speculative methods.

    vllm-rl bench das                                # 3 epochs, every drafter
    vllm-rl bench das --epochs 4 --configs stock,das-class

RL revisits the same problems epoch after epoch; DAS drafts from each problem's recent
rollouts (DAS Sec. 4.1), so epoch 1 fills the trees and later epochs draft from them.
Every configuration is its own engine (each DAS policy too: its trees and length history
are its own), all alive in this process; each epoch runs every configuration on the same
prompts with the same seeds, interleaved, at temperature 1 (``M`` samples per prompt,
sent as ``M`` single requests, verl's way).

Configurations: ``stock`` (vLLM's default engine, async scheduling, no speculation),
``stock-sync`` (the same with synchronous scheduling, which every CPU drafter needs),
``ngram`` (prompt lookup, n-grams of 2..5), ``suffix`` (Arctic Inference's
SuffixDecoding: a tree per request over its prompt and a global tree over past
responses; needs ``arctic-inference``, skipped otherwise), ``das-class`` (length-class
budgets, Sec. 4.2.3), ``das-fixed`` (always 2b: a constant budget, not the paper's
unlimited one of Sec. 5.3) and ``das-optimal`` (Eq. 7).  All drafters propose at most 8 tokens.

Per configuration and epoch: wall time, generated tokens, engine steps (= forward
passes), forward passes per generated token, and tokens per request-step (the mean
accepted length: 1 + accepted drafts per verification round, counted over every decode
step of every request).  The summary gives epochs 2.. (warm trees) and each
configuration's wall-time ratio to ``stock`` on them.

Every engine records its steps (:mod:`vllm_rl.engine.trace`), so each epoch is also
priced on a GPU step-cost table (``--cost``; a projection, not a GPU measurement): the
forward passes only ("GPU ms"), and with the host time measured here on each step's
critical path ("+host ms": scheduling, output processing, the DAS drafter; times
``--host-scale``), summed with the forward pass in the synchronous engines (every
drafter, ``stock-sync``) and overlapped with it in ``stock``'s asynchronous one
(:func:`vllm_rl.cost.host.host_counted`); "GPU x" and "+host x" are ``stock``'s time over
the configuration's.  The host time of vLLM's own ``ngram`` / ``suffix`` proposers runs in
the model runner and is not timed apart: it is in no column but the CPU wall.

Engines run in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) unless ``--multiprocess``:
on this 2-core machine vLLM's engine-core and worker processes compete with the compute
for the cores, which slows every configuration here, and the speculative
ones most (they add a round trip per step to fetch the drafts).  Either way every
configuration runs the same way.

Note: vLLM 0.32.0's CPU backend samples speculative steps with ``temperature > 0`` from
uninitialised temperatures; ``patches/rejection_sampler.py`` (applied by the vllm_rl plugin
in every vLLM process here, stock engines included) fixes it, so every speculative
baseline here samples correctly.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path


K = 8     # draft tokens per verification, every drafter


def engines(names: list[str], model: str, seed: int, max_model_len: int = 1024) -> dict:
    """One engine per configuration (skipping ``suffix`` without Arctic Inference)."""
    import vllm

    from vllm_rl import LLM
    from vllm_rl.engine.trace import CONFIG_KEY, TRACED_SCHEDULER_CLS, TRACED_SYNC_SCHEDULER_CLS
    from vllm_rl.llm import CPU_KV_CACHE_BYTES

    common = dict(seed=seed, max_model_len=max_model_len, use_tqdm_on_load=False)
    stock = dict(kv_cache_memory_bytes=CPU_KV_CACHE_BYTES, additional_config={CONFIG_KEY: True},
                 **common)
    sync = dict(async_scheduling=False, scheduler_cls=TRACED_SYNC_SCHEDULER_CLS, **stock)
    make = {
        "stock": lambda: vllm.LLM(model, async_scheduling=True,
                                  scheduler_cls=TRACED_SCHEDULER_CLS, **stock),
        "stock-sync": lambda: vllm.LLM(model, **sync),
        "ngram": lambda: vllm.LLM(model, speculative_config={
            "method": "ngram", "num_speculative_tokens": K, "prompt_lookup_min": 2,
            "prompt_lookup_max": 5}, **sync),
        "suffix": lambda: vllm.LLM(model, speculative_config={
            "method": "suffix", "num_speculative_tokens": K}, **sync),
    }
    out = {}
    # In-process, each engine re-registers vLLM's CPU kernel overrides by walking every
    # loaded module; the ngram proposer loads numba (llvmlite), whose objects break that
    # walk, so the ngram engine starts last (after suffix, which imports Arctic).
    for name in sorted(names, key=lambda n: {"suffix": 1, "ngram": 2}.get(n, 0)):
        if name == "suffix":
            try:
                import arctic_inference  # noqa: F401
            except ImportError:
                print("suffix: skipped (pip install arctic-inference==0.3.0 to run it)")
                continue
        if name.startswith("das-"):
            out[name] = LLM(model, das={"budget": K // 2}, trace=True, **common)
        else:
            out[name] = make[name]()
    return out


@dataclass
class EpochRun:
    config: str
    epoch: int
    wall_s: float
    tokens: int
    engine_steps: int
    request_steps: int
    fwd_per_token: float
    tokens_per_request_step: float
    mean_reward: float
    mean_length: float
    draft_proposed: int = 0
    draft_accepted: int = 0
    projected_ms: float | None = None      # the engine's steps on the cost table, GPU only
    host_counted_ms: float | None = None   # the same with the host time measured here counted
    host_ms: float | None = None           # that host time (x host_scale)


def run_epoch(llm, name: str, prompts: list[str], m: int, seed: int, max_tokens: int,
              epoch: int, cost=None, host_scale: float = 1.0) -> EpochRun:
    """One rollout step, M single requests per prompt, through the engine's step loop."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    from vllm_rl import rl_params
    from vllm_rl.engine.trace import engine_trace
    from vllm_rl.outcome import RolloutInfo
    from vllm_rl.task import reward

    try:
        trace = engine_trace(llm)
    except RuntimeError:                    # --multiprocess: the trace is in another process
        trace = None
    mark = trace.mark() if trace is not None else None

    policy = name[len("das-"):] if name.startswith("das-") else None
    engine = llm.llm_engine
    texts: dict[str, list] = {}
    which: dict[str, int] = {}
    t0 = time.perf_counter()
    for i, prompt in enumerate(prompts):
        extra = rl_params(das={"problem_id": f"heldout-{i}", "policy": policy}) if policy else None
        for j in range(m):
            rid = f"{name}-{epoch}-{i}-{j}"
            which[rid] = i
            texts[rid] = []
            engine.add_request(rid, prompt, SamplingParams(
                temperature=1.0, max_tokens=max_tokens, seed=seed + m * i + j, extra_args=extra,
                output_kind=RequestOutputKind.DELTA))
    steps = request_steps = tokens = 0
    infos: list[RolloutInfo] = []
    while engine.has_unfinished_requests():
        steps += 1
        for out in engine.step():
            c = out.outputs[0]
            if c.token_ids:
                request_steps += 1
                tokens += len(c.token_ids)
            texts[out.request_id].append(c.text)
            if out.finished:
                infos.append(RolloutInfo.from_completion(c))
    wall = time.perf_counter() - t0
    proj = trace.since(mark).project(cost or "h100", host_scale=host_scale) if trace else None
    rewards = [reward(prompts[which[r]], "".join(t)) for r, t in texts.items()]
    return EpochRun(name, epoch, wall, tokens, steps, request_steps, steps / tokens,
                    tokens / request_steps, statistics.fmean(rewards), tokens / len(texts),
                    sum(i.draft_proposed or 0 for i in infos),
                    sum(i.draft_accepted or 0 for i in infos),
                    *((proj.total_ms, proj.host_counted_ms, proj.host_core_ms +
                       proj.host_worker_ms) if proj else (None, None, None)))


def summarize(runs: list[EpochRun]) -> list[dict]:
    warm = [r for r in runs if r.epoch > 0]
    by: dict[str, list[EpochRun]] = {}
    for r in warm:
        by.setdefault(r.config, []).append(r)
    rows = []
    for name, rs in by.items():
        row = {"config": name, "epochs": len(rs),
               **{k: statistics.fmean(getattr(r, k) for r in rs)
                  for k in ("wall_s", "tokens", "engine_steps", "fwd_per_token",
                            "tokens_per_request_step", "mean_reward", "mean_length")}}
        for k in ("projected_ms", "host_counted_ms", "host_ms"):    # None: multiprocess
            vals = [getattr(r, k) for r in rs]
            row[k] = None if None in vals else statistics.fmean(vals)
        prop = sum(r.draft_proposed for r in rs)
        row["acceptance"] = sum(r.draft_accepted for r in rs) / prop if prop else None
        first = [r for r in runs if r.config == name and r.epoch == 0]
        row["epoch1_wall_s"] = first[0].wall_s if first else None
        rows.append(row)
    base = next((r for r in rows if r["config"] == "stock"), None)
    for row in rows:
        if base is not None:
            row["wall_vs_stock"] = row["wall_s"] / base["wall_s"]
            row["fwd_vs_stock"] = row["engine_steps"] / base["engine_steps"]
            if base["projected_ms"] and row["projected_ms"]:
                row["gpu_speedup"] = base["projected_ms"] / row["projected_ms"]
                row["host_speedup"] = base["host_counted_ms"] / row["host_counted_ms"]
    return rows


COLUMNS = [("config", "config", "{}"), ("epoch1_wall_s", "epoch1 s", "{:.2f}"),
           ("wall_s", "warm s", "{:.2f}"), ("tokens", "tokens", "{:.0f}"),
           ("engine_steps", "fwd passes", "{:.0f}"), ("fwd_per_token", "fwd/token", "{:.4f}"),
           ("tokens_per_request_step", "accepted len", "{:.2f}"),
           ("acceptance", "draft acc", "{:.3f}"), ("mean_reward", "reward", "{:.3f}"),
           ("wall_vs_stock", "wall vs stock", "{:.3f}"), ("fwd_vs_stock", "fwd vs stock", "{:.3f}"),
           ("host_ms", "host ms", "{:.0f}"), ("projected_ms", "GPU ms (proj.)", "{:.0f}"),
           ("host_counted_ms", "+host ms (proj.)", "{:.0f}"),
           ("gpu_speedup", "GPU x (proj.)", "{:.3f}"), ("host_speedup", "+host x (proj.)", "{:.3f}")]


def print_table(rows: list[dict]) -> None:
    cells = [[h for _, h, _ in COLUMNS]]
    cells += [[fmt.format(r[k]) if r.get(k) is not None else "-" for k, _, fmt in COLUMNS]
              for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(COLUMNS))]
    for row in cells:
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                        for i, (c, w) in enumerate(zip(row, widths))))


ALL = ["stock", "stock-sync", "ngram", "suffix", "das-class", "das-fixed", "das-optimal"]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="vllm-rl bench das", description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="model path (default: the embedded model)")
    ap.add_argument("--prompts", type=int, default=64, help="held-out prompts (default 64)")
    ap.add_argument("--m", type=int, default=8, help="samples per prompt")
    ap.add_argument("--epochs", type=int, default=3,
                    help="epochs over the prompts; the first fills the trees (default 3)")
    ap.add_argument("--max-tokens", type=int, default=None,
                    help="(default: the kit's limit, 256 or 1,024)")
    ap.add_argument("--seed", type=int, default=0)
    from vllm_rl.task.kits import add_argument as add_task_argument

    add_task_argument(ap)
    ap.add_argument("--configs", default=",".join(ALL),
                    help=f"comma-separated, among {', '.join(ALL)} (default all)")
    ap.add_argument("--cost", default="h100:qwen3-8b",
                    help="the step-cost table the epochs are priced on (default h100:qwen3-8b)")
    ap.add_argument("--host-scale", type=float, default=1.0,
                    help="multiplies the host times measured here in the host-counted "
                         "projection: 0.5 models a host CPU twice as fast (default 1.0)")
    ap.add_argument("--out", default="bench-results", help="folder for JSON and vLLM's log")
    ap.add_argument("--multiprocess", action="store_true",
                    help="vLLM's default engine-core and worker processes (default: in-process)")
    args = ap.parse_args(argv)
    if not args.multiprocess:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"

    import vllm
    from tqdm import tqdm

    from vllm_rl.task import kit

    task = kit(args.task)
    args.max_tokens = args.max_tokens or task.max_tokens
    names = args.configs.split(",")
    unknown = set(names) - set(ALL)
    if unknown:
        ap.error(f"unknown configuration(s) {sorted(unknown)}; choose from {ALL}")
    model = args.model or str(task.model_path)
    from vllm_rl.cost import load_cost

    cost = load_cost(args.cost)
    llms = engines(names, model, args.seed, max(1024, task.max_model_len))
    names = [n for n in names if n in llms]
    prompts = task.heldout_prompts(args.prompts)
    for llm in llms.values():            # warm-up outside the timings (no DAS trees touched)
        llm.generate(prompts[:4], vllm.SamplingParams(n=2, max_tokens=16), use_tqdm=False)
    runs = []
    plan = [(e, n) for e in range(args.epochs) for n in names]
    for epoch, name in tqdm(plan, desc="epochs x configs", unit="run"):
        llm = llms[name]
        runs.append(run_epoch(llm, name, prompts, args.m, args.seed + 10_000 * epoch,
                              args.max_tokens, epoch, cost, args.host_scale))
    rows = summarize(runs)
    das_stats = {}
    for name in names:
        if name.startswith("das-"):
            st = llms[name].das_stats()
            st.pop("per_step", None)
            st.pop("per_problem", None)
            das_stats[name] = st
    print(f"\nmodel {model}; {len(prompts)} prompts x {args.m} samples; {args.epochs} epochs "
          f"(epoch 1 fills the trees; columns other than 'epoch1 s' average epochs 2..); "
          f"max_tokens {args.max_tokens}; temperature 1; {K} draft tokens at most; "
          f"{'multiprocess (no step trace: no projection)' if args.multiprocess else 'in-process'}"
          f" engines; 'GPU ms' is a PROJECTION on the {args.cost} table (forward "
          f"passes only), '+host ms' adds the host time MEASURED on this CPU (x "
          f"{args.host_scale:g}; sync engines: summed, async stock: overlapped)")
    print_table(rows)
    for name, st in das_stats.items():
        print(f"{name} drafter: {json.dumps(st)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"das-rollout-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps({"args": vars(args), "model": model, "summary": rows,
                                "das_stats": das_stats, "runs": [asdict(r) for r in runs]},
                               indent=2))
    print(f"\nwrote {path}")

