"""``vllm-rl bench``: the quick rollout benchmark, every technique and all combined vs stock vLLM.

Two in-process engines on the same model, started once: stock vLLM (its own scheduler,
with the step trace only) and the RL engine (RL scheduler, the DAS drafter and ARRoL's
head; a request uses only the techniques its flags name, the others cost it nothing).

1. A *previous* rollout step on the RL engine, untimed, as a trainer would have it: M
   samples per prompt with DAS (it fills each problem's tree) and ARRoL scoring with
   ``return_hidden``.  Its kept lengths give DUET's K1 = p30 / K2 = p80 (App. A.3); its
   hidden states and rewards train ARRoL's quality head and its calibration (κ = ρ = 0.5),
   pushed with ``arrol_update``.
2. The timed step, interleaved with the stock baselines, same prompts and seeds:
   ``stock-M``, ``stock-M'``, ``darts`` (M' samples, the M shortest kept, exact early
   stop), ``duet`` (marker gate), ``das`` (drafts from the trees, the engine's default
   policy), ``arrol`` (pruning at ``l_detect``), ``all`` (the four in one request, M').

Each run's engine steps are priced on the H100 step-cost table (``--cost``; a projection,
see :mod:`vllm_rl.cost`), beside the CPU wall.  Output: a table, ``bench-<time>.json``
and two PNGs (length CDF, running requests over the step) in ``--out``.
"""
from __future__ import annotations

import json
import os
import statistics
import time
from dataclasses import asdict
from pathlib import Path

from vllm_rl.bench.step import TASK_MARKER, Config, interleave, run_once, summarize

TECHNIQUES = ("darts", "duet", "das", "arrol", "all")


def configs(m: int, m_prime: int, duet: dict, arrol: dict) -> dict[str, Config]:
    """The quick matrix: two stock baselines, each technique alone, all four together."""
    from vllm_rl import rl_params

    small, big = f"stock-{m}", f"stock-{m_prime}"
    darts = {"group": {"size": m}, "darts": {"mode": "shortest"}}
    cfgs = [
        Config(small, "stock", m, m),
        Config(big, "stock", m_prime, m_prime),
        Config("darts", "rl", m_prime, m, lambda mm, mp: rl_params(**darts), small),
        Config("duet", "rl", m, m, lambda mm, mp: rl_params(duet=duet), small),
        Config("das", "rl", m, m, lambda mm, mp: rl_params(das={}), small),
        Config("arrol", "rl", m, m, lambda mm, mp: rl_params(arrol=arrol), small),
        Config("all", "rl", m_prime, m,
               lambda mm, mp: rl_params(**darts, duet=duet, das={}, arrol=arrol), small),
    ]
    return {c.name: c for c in cfgs}


def make_engines(model: str, seed: int, cost: str):
    """(stock, rl) in-process engines, both with the step trace."""
    import vllm

    from vllm_rl import LLM
    from vllm_rl.engine.trace import CONFIG_KEY, TRACED_SCHEDULER_CLS
    from vllm_rl.llm import CPU_KV_CACHE_BYTES

    common = dict(seed=seed, max_model_len=1024, use_tqdm_on_load=False)
    stock = vllm.LLM(model, scheduler_cls=TRACED_SCHEDULER_CLS, async_scheduling=True,
                     additional_config={CONFIG_KEY: True},
                     kv_cache_memory_bytes=CPU_KV_CACHE_BYTES, **common)
    rl = LLM(model, trace=True, das=True, arrol=True, cost=cost, **common)
    return stock, rl


def previous_step(llm, prompts, m: int, max_tokens: int, seed: int, l_detect: int,
                  kappa: float, rho: float) -> tuple[dict, dict]:
    """The untimed previous step on the RL engine: DAS trees filled, DUET's thresholds and
    ARRoL's head and calibration from its samples.  Returns (duet flags, head summary)."""
    import torch
    from vllm import SamplingParams

    from vllm_rl import rl_params
    from vllm_rl.control import arrol as ctl
    from vllm_rl.control.duet import percentile
    from vllm_rl.task import reward

    sp = SamplingParams(n=m, temperature=1.0, max_tokens=max_tokens, seed=seed,
                        extra_args=rl_params(das={}, arrol={"l_detect": l_detect,
                                                            "return_hidden": True}))
    outs = llm.generate(prompts, sp, use_tqdm=False)
    kept, hidden, labels = [], [], []
    for prompt, out in zip(prompts, outs):
        for c in out.outputs:
            r = reward(prompt, c.text)
            if c.finish_reason == "stop":
                kept.append(len(c.token_ids))
            if c.rollout_info.hidden is not None:
                hidden.append(torch.tensor(c.rollout_info.hidden_state()))
                labels.append(r)
    duet = {"k1": round(percentile(kept, 30)), "k2": round(percentile(kept, 80)),
            "grace": max(1, round(150 * max_tokens / 3072)), "eps": 0.05,
            "pattern": TASK_MARKER}
    xs = torch.stack(hidden)
    torch.manual_seed(seed)
    head = ctl.QualityHead(xs.shape[1])
    ctl.HeadTrainer(head, lr=1e-3).fit(xs, labels, epochs=30, batch_size=256)
    scores = head.score(xs).tolist()
    buffer = ctl.CalibrationBuffer()
    buffer.add(scores, labels)
    version = llm.arrol_update(head=head.export(1), calibration=buffer.calibration(
        kappa=kappa, rho=rho))
    return duet, {"version": version, "trained_on": len(labels),
                  "train_auc": ctl.auc(scores, labels), "positive_share": statistics.fmean(labels)}


def main(args) -> dict:
    """Run the quick benchmark (``args`` from :func:`vllm_rl.cli.bench.parser`)."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"   # the step trace lives in the core
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # torch's C++ warnings (NUMA binding)
    t_start = time.perf_counter()
    from vllm_rl.bench.logs import vllm_log_to

    out_dir = Path(args.out)
    log = vllm_log_to(out_dir / "vllm.log", announce=False)
    from tqdm import tqdm

    from vllm_rl.cost import load_cost
    from vllm_rl.task import MODEL_PATH, heldout_prompts

    model = args.model or str(MODEL_PATH)
    prompts = heldout_prompts(args.prompts)
    arrol = {"l_detect": args.l_detect, "kappa": 0.5, "rho": 0.5}
    bar = tqdm(total=4, desc="vllm-rl bench", unit="stage", dynamic_ncols=True)
    bar.set_postfix_str("starting engines (stock vLLM, RL)")
    stock, rl = make_engines(model, args.seed, args.cost)
    cost = load_cost(args.cost)
    bar.update(1)
    bar.set_postfix_str("warm-up (stock: one untimed step)")
    from vllm import SamplingParams

    for llm in (stock, rl):
        llm.generate(prompts[:4], SamplingParams(n=2, max_tokens=16), use_tqdm=False)
    # stock sees the step's batch shapes once too (the RL engine sees them in the previous step)
    stock.generate(prompts, SamplingParams(n=args.m, temperature=1.0, max_tokens=args.max_tokens,
                                           seed=args.seed + 1000), use_tqdm=False)
    bar.update(1)
    bar.set_postfix_str("previous step (DAS trees, DUET K1/K2, ARRoL head)")
    duet, head = previous_step(rl, prompts, args.m, args.max_tokens, args.seed + 1000,
                               args.l_detect, 0.5, 0.5)
    bar.update(1)
    cfgs = configs(args.m, args.m_prime, duet, arrol)
    wanted = [c for c in cfgs.values() if c.engine == "rl"
              and (args.configs == "all" or c.name in args.configs.split(","))]
    stocks = [c for c in cfgs.values() if c.engine == "stock"]
    plan = [(c, rep) for rep in range(args.repeats) for c in interleave(stocks, wanted)]
    bar.total += len(plan) - 1
    engines = {"stock": stock, "rl": rl}
    runs = []
    for cfg, rep in plan:
        bar.set_postfix_str(f"step: {cfg.name} (repeat {rep + 1}/{args.repeats})")
        runs.append(run_once(engines[cfg.engine], cfg, prompts, args.m, args.seed,
                             args.max_tokens, rep, cost))
        bar.update(1)
    bar.set_postfix_str("done")
    bar.close()
    for llm in (stock, rl):
        llm.llm_engine.engine_core.shutdown()
    order = list(cfgs)
    rows = sorted(summarize(runs, cfgs), key=lambda r: order.index(r["config"]))
    total_s = time.perf_counter() - t_start
    result = {"model": model, "args": {k: v for k, v in vars(args).items() if k != "func"},
              "duet": duet, "arrol": {**arrol, "head": head}, "summary": rows,
              "runs": [asdict(r) for r in runs], "total_s": total_s}
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"bench-{stamp}.json"
    path.write_text(json.dumps(result, indent=1))
    pngs = pictures(runs, args, out_dir, stamp)
    print(header(args, model, len(prompts), duet, head))
    print_table(rows, f"stock-{args.m}", f"stock-{args.m_prime}")
    print(f"\nresults: {path}\npictures: {', '.join(str(p) for p in pngs)}\n"
          f"vLLM's log: {log}\ntotal {total_s:.0f} s")
    return result


def header(args, model: str, n_prompts: int, duet: dict, head: dict) -> str:
    return (f"\nvllm-rl bench: {model}\n{n_prompts} held-out prompts, M = {args.m} kept per "
            f"prompt (M' = {args.m_prime} for darts/all), max_tokens {args.max_tokens}, "
            f"temperature 1, one step per configuration (median of {args.repeats}), "
            f"interleaved with stock vLLM, in-process engines on this machine.\n"
            f"previous step gave DUET K1/K2 = {duet['k1']}/{duet['k2']} and ARRoL's head "
            f"(train AUC {head['train_auc']:.2f} on {head['trained_on']} samples; "
            f"l_detect {args.l_detect}, kappa 0.5).\n"
            f"'H100 ms' is a PROJECTION: the same engine steps priced on the {args.cost} "
            f"step-cost table (not a GPU measurement); speedups are stock-{args.m}'s time "
            f"over the configuration's, at the same M kept per prompt.\n")


COLUMNS = [  # (key, header, format)
    ("config", "config", "{}"), ("wall_s", "CPU s", "{:.1f}"),
    ("generated_tokens", "tokens", "{:.0f}"), ("engine_steps", "steps", "{:.0f}"),
    ("kept_samples", "kept", "{:.0f}"), ("kept_mean_reward", "kept reward", "{:.3f}"),
    ("kept_mean_length", "kept len", "{:.1f}"), ("projected_ms", "H100 ms (proj.)", "{:.0f}"),
]


def print_table(rows: list[dict], base: str, big: str) -> None:
    cols = COLUMNS + [(f"wall_vs_{base}", f"CPU speedup vs {base}", "{:.2f}x"),
                      (f"h100_vs_{base}", f"H100 speedup vs {base} (proj.)", "{:.2f}x"),
                      ("notes", "technique counts", "{}")]
    cells = [[h for _, h, _ in cols]]
    for r in rows:
        r = dict(r)
        if f"wall_vs_{base}" in r:          # summarize gives config/base; invert to speedup
            r[f"wall_vs_{base}"] = 1.0 / r[f"wall_vs_{base}"]
        if r["config"] == base:
            r[f"wall_vs_{base}"] = r[f"h100_vs_{base}"] = 1.0
        r["notes"] = notes(r)
        cells.append([fmt.format(r[k]) if r.get(k) not in (None, "") else ""
                      for k, _, fmt in cols])
    widths = [max(len(row[i]) for row in cells) for i in range(len(cols))]
    for n, row in enumerate(cells):
        print("  ".join(c.ljust(w) if i in (0, len(cols) - 1) else c.rjust(w)
                        for i, (c, w) in enumerate(zip(row, widths))).rstrip())
        if n == 0:
            print("  ".join("-" * w for w in widths))


def notes(r: dict) -> str:
    out = []
    if r.get("aborted_share"):
        out.append(f"duet aborted {r['aborted_share']:.0%}")
    if r.get("eps_kept_share"):
        out.append(f"eps-kept {r['eps_kept_share']:.1%}")
    if r.get("draft_proposed"):
        out.append(f"drafts accepted {r['draft_accepted'] / r['draft_proposed']:.0%}")
    if r.get("arrol_pruned"):
        out.append(f"arrol pruned {r['arrol_pruned'] / r['samples']:.0%}")
    if r.get("samples") and r.get("kept_samples") and r["samples"] > r["kept_samples"] \
            and not r.get("arrol_pruned") and not r.get("aborted_share"):
        out.append(f"{r['samples'] - r['kept_samples']:.0f} not kept")
    return ", ".join(out)


def pictures(runs, args, out_dir: Path, stamp: str) -> list[Path]:
    """The length CDF and running requests over the step (first repeat of each config)."""
    from vllm_rl.cli import plots

    first = {}
    for name in configs(args.m, args.m_prime, {}, {}):     # the table's order
        first.update({name: r for r in runs[::-1] if r.config == name})
    title = (f"{args.prompts} prompts, M = {args.m} (M' = {args.m_prime}), "
             f"max_tokens {args.max_tokens}")
    cdf = plots.length_cdf({n: r.lengths for n, r in first.items()},
                           out_dir / f"bench-{stamp}-lengths.png",
                           f"Generated length per sample, one rollout step ({title})",
                           args.max_tokens)
    by_time, by_step = {}, {}
    for name, r in first.items():
        walls = list(r.step_wall_ms[:len(r.batch_profile)])
        if walls:       # the trace may charge the idle time before the run to its first step
            walls[0] = min(walls[0], max(0.0, r.wall_s * 1e3 - sum(walls[1:])))
        t, xs = 0.0, []
        for ms in walls:
            xs.append(t)
            t += ms / 1e3
        by_time[name] = (xs, r.batch_profile[:len(xs)])
        by_step[name] = (list(range(len(r.batch_profile))), r.batch_profile)
    run = plots.running(by_step, out_dir / f"bench-{stamp}-running.png",
                        f"Samples running in each engine step of one rollout step ({title})",
                        "engine step", by_time,
                        "seconds since the step started (CPU wall on this machine)")
    return [cdf, run]
