"""``vllm-rl bench step``: one RL rollout step per configuration, against stock vLLM.

Three in-process engines on the same model (:mod:`.engines`), each configuration on the
one a user would build for it (:func:`vllm_rl.bench.matrix.engine_kind`): stock vLLM
(its own scheduler, with the step trace only), the RL engine without the DAS drafter
(DARTS, DUET, ARRoL alone) and the DAS engine (every configuration that drafts), both
RL engines with ARRoL's head; all three schedule asynchronously, as on a GPU.  The step
is run as a trainer runs it:

1. **Previous steps** (untimed, two): M samples per prompt on the RL engine, with DAS
   (each problem's tree fills) and ARRoL scoring.  From their records: DARTS's length
   statistics per prompt (:class:`vllm_rl.darts.DartsPlanner`), DUET's K1/K2 as the
   engine's own estimate would give them (p30/p80 of the natural lengths, cut-short
   samples censored: :func:`vllm_rl.duet.rule.km_quantile`), and ARRoL's head and
   calibration (:class:`vllm_rl.arrol.ArrolFeedback`: the second step's scores are the
   held-out check of the head the first one trained).
2. **The timed step**: every configuration (:mod:`.matrix`) on the same prompts with the
   same seeds, interleaved with the stock baselines, ``--repeats`` times.  Before each
   one on the DAS engine its trees are put back as the previous steps left them
   (:func:`reset_trees`), so no configuration drafts from another's rollouts.  A
   configuration with partial rollouts (``+partial``) runs two untimed steps of its own
   first, so the timed step is one with carried samples, as in training; its groups are
   the complete ones (:func:`run_once`).

Each run's engine steps are priced on a GPU step-cost table (``--cost``; a projection,
:mod:`vllm_rl.cost`), beside the CPU wall, twice: the forward passes only ("GPU"), and
with the host time measured here on each step's critical path ("+host": scheduling,
output processing with the RL hooks, DAS's drafter, ARRoL's scorer, times
``--host-scale``), priced as the engine schedules (:func:`vllm_rl.cost.host.host_counted`:
under async scheduling the host work overlaps the forward pass, except what a drafting
DAS step does after it waited for the last step's ids, which adds to it).  ``--gpu-limits`` gives the engines an H100's
scheduler limits, so batch shapes are the GPU's.  Reported per configuration: tokens,
engine steps, the training group (samples, mean reward and length), the learning-signal
diagnostics of :func:`vllm_rl.integrations.common.advantages.step_diagnostics`, and the
speed-up over ``stock-M`` (CPU, projected GPU-only and projected with host time).
Output: a table, a JSON file and two PNGs (length CDF; running samples over the step) in
``--out``, vLLM's log in ``--out/vllm.log``.  ``vllm-rl bench`` with no subcommand is this benchmark at its quick
defaults.
"""
from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from vllm_rl.bench.matrix import (CONFIGS, engine_kind, is_config, partial_setting,
                                  technique_flags)
from vllm_rl.das.config import BATCH_CAPS

ARROL_GATES = ("steering", "cold", "balance", "auc")


def arrol_gate(name: str) -> dict:
    """``ArrolFeedback``'s gate keywords for ``--arrol-gate``."""
    from vllm_rl.arrol.controller import AUC_GATE

    return {"steering": {"gate": "steering"}, "cold": {"gate": "cold"},
            "balance": {"gate": "balance", "auc_gate": AUC_GATE},
            "auc": {"gate": "cold", "auc_gate": AUC_GATE}}[name]


EXTRA = ("darts-shortest", "das-off")      # ablations: uniform M' = 2M shortest; drafts off


def _budget(text: str) -> float | str:
    return text if text in ("adaptive", "cost") else float(text)


def parser(prog: str = "vllm-rl bench step") -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", default=",".join(c for c in CONFIGS if c != "stock"),
                    help=f"comma-separated, among {', '.join(CONFIGS[1:] + EXTRA)} (the "
                         "stock baselines always run)")
    ap.add_argument("--prompts", type=int, default=16, help="held-out prompts (default 16)")
    ap.add_argument("--m", type=int, default=8, help="training group size M (default 8)")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--l-detect", type=int, default=24, help="ARRoL's l_detect (default 24)")
    ap.add_argument("--darts-budget", type=_budget, default="adaptive",
                    help="DARTS's total redundancy: 'adaptive' (the default: App. B's "
                         "Eq. 8-9 on the step-cost model --cost, lambda calibrated to "
                         "1.5 M N on the first step with lengths, off where the model "
                         "predicts redundancy slower), 'cost' (the multiple the model "
                         "predicts cheapest), or x M N in [1, 2] fixed (DartsPlanner)")
    ap.add_argument("--arrol-gate", default="steering", choices=ARROL_GATES,
                    help="ARRoL's pruning gate after the cold start (ArrolFeedback): "
                         "'steering' (the default: Eq. 2 against random pruning at the "
                         "same keep rate, Table 4), 'cold' (the cold start alone), "
                         "'balance' (the balance test and the within-group AUC floor) or "
                         "'auc' (the AUC floor alone)")
    ap.add_argument("--repeats", type=int, default=1,
                    help="interleaved repeats; the table gives medians (default 1)")
    ap.add_argument("--gpu-limits", action="store_true",
                    help="engines with an H100's scheduler limits (max_num_seqs 1024, "
                         "max_num_batched_tokens 16384): the GPU's batch shapes")
    ap.add_argument("--kv-gib", type=float, default=1.0,
                    help="KV cache per engine, GiB (3 holds 1024 sequences at "
                         "max_tokens 256 on the embedded model)")
    ap.add_argument("--cost", default="h100:qwen3-8b",
                    help="the step-cost table the runs are priced on, and the DAS engine "
                         "plans with (default h100:qwen3-8b)")
    ap.add_argument("--host-scale", type=float, default=1.0,
                    help="multiplies the host times measured here in the host-counted "
                         "projection: 0.5 models a host CPU twice as fast (default 1.0)")
    ap.add_argument("--das-batch-cap", default=None, choices=BATCH_CAPS,
                    help="the DAS engine's batch cap (DASConfig.batch_cap; default the "
                         "engine's, 'confidence')")
    ap.add_argument("--das-config", default=None, metavar="JSON",
                    help="more DASConfig fields for the DAS engine, e.g. "
                         "'{\"lookahead\": false}' (default: the engine's)")
    ap.add_argument("--model", default=None, help="model path (default: the embedded model)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="bench-results", help="folder for JSON, PNGs, vllm.log")
    return ap


# ----------------------------------------------------------------------------- the run


@dataclass
class Run:
    """One configuration's rollout step."""

    config: str
    repeat: int
    wall_s: float
    tokens: int
    engine_steps: int
    projected_ms: float
    samples: int
    kept: int
    kept_mean_reward: float
    kept_mean_length: float
    reasons: dict[str, int] = field(default_factory=dict)
    draft_proposed: int = 0
    draft_accepted: int = 0
    diagnostics: dict[str, float] = field(default_factory=dict)
    lengths: list[int] = field(default_factory=list)
    batch_profile: list[int] = field(default_factory=list)
    step_wall_ms: list[float] = field(default_factory=list)
    host_counted_ms: float = 0.0     # projected_ms with the host time counted
    host_core_ms: float = 0.0        # measured: schedule + update_from_output (x host_scale)
    host_worker_ms: float = 0.0      # measured: drafter + scorer (x host_scale)
    asynchronous: bool | None = None     # how the engine schedules
    timeline: dict = field(default_factory=dict)   # per step: gpu_ms, core_ms, worker_ms


def _drive(llm, name: str, params: list, prompts: list, repeat: int) -> tuple[list, float]:
    """One rollout step through the engine's step loop (one request per prompt, its own
    ``SamplingParams``): the outputs in order, and the wall time."""
    from vllm.sampling_params import RequestOutputKind

    from vllm_rl.llm import attach_rollout_info

    engine = llm.llm_engine
    ids, outputs = {}, {}
    t0 = time.perf_counter()
    for i, (prompt, sp) in enumerate(zip(prompts, params)):
        sp.output_kind = RequestOutputKind.FINAL_ONLY
        rid = f"{name}-{repeat}-{i}"
        ids[rid] = i
        engine.add_request(rid, prompt, sp)
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                outputs[ids[out.request_id]] = out
    wall = time.perf_counter() - t0
    outs = [outputs[i] for i in range(len(prompts))]
    attach_rollout_info(outs, params)
    return outs, wall


def run_once(llm, name: str, params: list, prompts: list[str], repeat: int, cost,
             host_scale: float = 1.0) -> Run:
    """One rollout step of configuration ``name`` and its records.  With partial
    rollouts (``+partial``) the timed step is APRIL's third: two untimed steps first fill
    the carry buffer, then the step launches the carried samples' continuations beside
    the prompts and ends by its rule; its groups are those complete (their samples from
    any of the three steps: the lengths, rewards and marks are the whole samples')."""
    from vllm_rl.engine.trace import engine_trace

    trace = engine_trace(llm)
    setting = partial_setting(name) if is_config(name) else None
    if setting is None:
        mark = trace.mark()
        outs, wall = _drive(llm, name, params, prompts, repeat)
        groups = [(prompt, (sp.extra_args or {}).get("vllm_rl"),
                   [(c.rollout_info, c.text, len(c.token_ids)) for c in out.outputs])
                  for prompt, out, sp in zip(prompts, outs, params)]
        return _summarize_step(name, repeat, trace.since(mark), groups, wall, cost, host_scale)
    from vllm_rl.integrations.common.partial import CarryBuffer, PartialConfig

    cfg, buffer = PartialConfig(**setting), CarryBuffer()
    max_tokens = params[0].max_tokens
    for step in range(3):
        step_params_ = [copy.deepcopy(sp) for sp in params]
        for sp in step_params_:
            sp.seed = sp.seed + 1_000_003 * (2 - step)      # the timed step: the seeds given
        launched = buffer.launch(cfg, 1_000 * repeat + step, prompts, step_params_,
                                 max_tokens, 1.0)
        mark = trace.mark()
        outs, wall = _drive(llm, f"{name}-s{step}", launched.params, launched.prompts, repeat)
        complete = buffer.finish(launched, outs)
    groups = [(g.prompt, g.flags, [(p.info, p.text, len(p.token_ids)) for p in g.ended])
              for g in complete]
    return _summarize_step(name, repeat, trace.since(mark), groups, wall, cost, host_scale)


def _summarize_step(name: str, repeat: int, steps, groups: list, wall: float, cost,
                    host_scale: float) -> Run:
    """A :class:`Run` from the engine steps it took and its groups (prompt, the flags
    sent, per sample: record, text, length)."""
    from vllm_rl.integrations.common.advantages import group_advantages, step_diagnostics
    from vllm_rl.integrations.common.marks import training_marks
    from vllm_rl.task import reward

    marks, rewards, members, kept, lengths, reasons = [], [], [], [], [], {}
    proposed = accepted = 0
    for i, (prompt, flags, samples) in enumerate(groups):
        infos = [info for info, _, _ in samples]
        for (info, text, n), mk in zip(samples, training_marks(infos, [flags] * len(infos))):
            r = reward(prompt, text)
            marks.append(mk)
            rewards.append(r)
            members.append(i)
            lengths.append(n)
            reasons[info.reason.value] = reasons.get(info.reason.value, 0) + 1
            proposed += info.draft_proposed or 0
            accepted += info.draft_accepted or 0
            if mk.keep:
                kept.append((r, n))
    diag = step_diagnostics(marks, group_advantages(rewards, marks, members), members)
    proj = steps.project(cost, host_scale=host_scale)
    core, worker, path = steps.host_ms()
    timeline = {"gpu_ms": list(proj.per_step_ms),
                "core_ms": [host_scale * c for c in core],
                "worker_ms": [host_scale * w for w in worker],
                "path_ms": [host_scale * p for p in path]}
    return Run(name, repeat, wall, sum(lengths), len(steps), proj.total_ms,
               len(lengths), len(kept),
               statistics.fmean(r for r, _ in kept) if kept else 0.0,
               statistics.fmean(n for _, n in kept) if kept else 0.0, reasons, proposed,
               accepted, diag, lengths, [len(w) for w, _ in steps.steps()],
               list(steps.wall_ms), proj.host_counted_ms, proj.host_core_ms,
               proj.host_worker_ms, proj.asynchronous, timeline)


# ----------------------------------------------------------------------------- the step


def previous_steps(rl, prompts: list[str], args, planner, feedback,
                   plain=None) -> tuple[dict, dict]:
    """Two untimed steps on the DAS engine (module docstring): DAS trees, DARTS's length
    statistics, DUET's K1/K2 and ARRoL's head (given to ``plain`` too, the RL engine
    without DAS).  Returns DUET's thresholds and, per prompt, its prompt ids and the
    rollouts the steps drew (what its tree holds: :func:`reset_trees`)."""
    from vllm import SamplingParams

    from vllm_rl import Reason, rl_params
    from vllm_rl.duet.rule import km_quantile
    from vllm_rl.task import reward

    observations, trees = [], {}
    for step in range(2):
        params = [SamplingParams(n=args.m, temperature=1.0, max_tokens=args.max_tokens,
                                 seed=args.seed + 100_000 + 1000 * step + i,
                                 extra_args=rl_params(das={"problem_id": p}, arrol={
                                     "l_detect": args.l_detect, "return_hidden": True}))
                  for i, p in enumerate(prompts)]
        outs = rl.generate(prompts, params, use_tqdm=False)
        infos, rewards, groups = [], [], []
        planner.observe({prompt: [len(c.token_ids) for c in out.outputs]
                         for prompt, out in zip(prompts, outs)})
        for prompt, out in zip(prompts, outs):
            _, drawn = trees.setdefault(prompt, (list(out.prompt_token_ids), []))
            drawn.extend(list(c.token_ids) for c in out.outputs)
            for c in out.outputs:
                infos.append(c.rollout_info)
                rewards.append(reward(prompt, c.text))
                groups.append(prompt)
                observations.append((len(c.token_ids), c.rollout_info.reason is Reason.EOS,
                                     1.0))
        update = feedback.observe(infos, rewards, groups)
        if update is not None:
            for engine in (rl, plain):
                if engine is not None:
                    engine.arrol_update(**update)
    k1 = km_quantile(observations, 0.30)
    return {"k1": k1, "k2": max(k1, km_quantile(observations, 0.80))}, trees


def reset_trees(rl, trees: dict) -> None:
    """The DAS engine's trees as the previous steps left them (``trees``, from
    :func:`previous_steps`), before each configuration that drafts: the configurations
    run one after another on one engine with the same prompts, problem ids and seeds,
    and without this one would draft from an earlier one's rollouts of the same step."""
    rl.das_clear()
    for prompt, (prompt_ids, rollouts) in trees.items():
        rl.das_prebuild(prompt, rollouts, prompt_ids)


def step_params(name: str, prompts: list[str], args, plans: dict, duet: dict) -> list:
    """Each prompt's ``SamplingParams`` under configuration ``name`` (same seeds for all)."""
    from vllm import SamplingParams

    from vllm_rl import rl_params
    from vllm_rl.darts import DartsPlanner

    def sp(i: int, n: int, extra):
        return SamplingParams(n=n, temperature=1.0, max_tokens=args.max_tokens,
                              seed=args.seed + 7919 * i, extra_args=extra)

    m, out = args.m, []
    for i, prompt in enumerate(prompts):
        if name.startswith("stock"):
            out.append(sp(i, int(name.split("-")[1]), None))
            continue
        if name == "darts-shortest":
            out.append(sp(i, 2 * m, rl_params(group={"size": m}, darts={"mode": "shortest"})))
            continue
        if name == "das-off":
            out.append(sp(i, m, rl_params(das={"problem_id": prompt, "budget": 0})))
            continue
        flags = technique_flags(name, args.max_tokens, args.l_detect, duet)
        n = m
        if "das" in flags:
            flags["das"] = {**flags["das"], "problem_id": prompt}
        if "darts" in flags:            # the planner's: none where DARTS is off
            plan = plans[prompt]
            n = plan.n
            del flags["darts"]
            flags.pop("group", None)
            flags.update(DartsPlanner.flags(plan))
        out.append(sp(i, n, rl_params(**flags)))
    return out


def main(argv: list[str] | None = None, prog: str = "vllm-rl bench step") -> dict:
    ap = parser(prog)
    args = ap.parse_args(argv)
    names = [c for c in args.configs.split(",") if c and c != "stock"]
    unknown = sorted(n for n in names if n not in EXTRA and not is_config(n))
    if unknown:
        ap.error(f"unknown configuration(s) {unknown}; choose from "
                 f"{', '.join(CONFIGS[1:] + EXTRA)}, a '+'-combination of the techniques, "
                 "or technique:option")
    from vllm_rl.bench.engines import in_process

    in_process()
    t_start = time.perf_counter()
    out_dir = Path(args.out)
    from vllm_rl.bench.logs import vllm_log_to

    log = vllm_log_to(out_dir / "vllm.log", announce=False)
    from tqdm import tqdm

    from vllm_rl.arrol import ArrolFeedback
    from vllm_rl.bench.engines import rl_engine, shutdown, stock_engine
    from vllm_rl.cost import load_cost
    from vllm_rl.darts import DartsPlanner
    from vllm_rl.task import MODEL_PATH, heldout_prompts

    model = args.model or str(MODEL_PATH)
    prompts = heldout_prompts(args.prompts)
    bar = tqdm(total=4, desc="vllm-rl bench step", unit="stage", dynamic_ncols=True)
    bar.set_postfix_str("starting engines (stock vLLM, RL, RL with DAS)")
    kv = int(args.kv_gib * (1 << 30))
    stock = stock_engine(model, args.seed, args.gpu_limits, kv)
    das = {**({"batch_cap": args.das_batch_cap} if args.das_batch_cap else {}),
           **(json.loads(args.das_config) if args.das_config else {})} or True
    kinds = {engine_kind(n) for n in names}
    rl = rl_engine(model, args.seed, args.gpu_limits, kv, das=das, cost=args.cost)
    plain = (rl_engine(model, args.seed, args.gpu_limits, kv, das=None, cost=args.cost)
             if "rl" in kinds else None)
    engines = {"stock": stock, "das": rl, "rl": plain}
    cost = load_cost(args.cost)
    bar.update(1)
    bar.set_postfix_str("previous steps (DAS trees, DARTS lengths, DUET K1/K2, ARRoL head)")
    from vllm_rl.bench.engines import GPU_LIMITS

    planner = DartsPlanner(args.m, budget=args.darts_budget, cost=args.cost,
                           max_tokens=args.max_tokens,
                           max_live=GPU_LIMITS["max_num_seqs"] if args.gpu_limits else None)
    feedback = ArrolFeedback({"l_detect": args.l_detect}, cold_start_steps=0,
                             **arrol_gate(args.arrol_gate),
                             gate_min=16, seed=args.seed)
    duet, trees = previous_steps(rl, prompts, args, planner, feedback, plain)
    plans = {p.prompt_id: p for p in planner.plan(prompts)}
    from vllm import SamplingParams

    stock.generate(prompts, SamplingParams(n=args.m, temperature=1.0,      # stock's warm-up
                                           max_tokens=args.max_tokens, seed=args.seed + 99),
                   use_tqdm=False)
    bar.update(1)
    stocks = [f"stock-{args.m}", f"stock-{2 * args.m}"]
    order = [n for pair in zip(stocks + [None] * len(names), names + [None] * 2)
             for n in pair if n]
    plan = [(n, rep) for rep in range(args.repeats) for n in order]
    bar.total += len(plan) - 1
    runs = []
    for name, rep in plan:
        bar.set_postfix_str(f"{name} (repeat {rep + 1}/{args.repeats})")
        llm = engines[engine_kind(name)]
        if llm is rl:               # every drafting configuration: the same trees
            reset_trees(rl, trees)
        runs.append(run_once(llm, name, step_params(name, prompts, args, plans, duet),
                             prompts, rep, cost, args.host_scale))
        bar.update(1)
    bar.set_postfix_str("done")
    bar.close()
    shutdown(*(e for e in (stock, rl, plain) if e is not None))
    rows = summarize(runs, stocks[0])
    result = {"model": model, "args": vars(args), "duet": duet,
              "arrol": feedback.metrics, "darts": {p: plans[p].n for p in prompts},
              "darts_budget": planner.last_budget, "darts_plan": planner.metrics,
              "summary": rows, "runs": [asdict(r) for r in runs],
              "total_s": time.perf_counter() - t_start}
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"step-{stamp}.json"
    path.write_text(json.dumps(result, indent=1))
    pngs = pictures(runs, args, out_dir, stamp)
    print(header(args, model, len(prompts), duet, feedback.metrics, plans))
    print(table(rows, stocks[0]))
    print(f"\nresults: {path}\npictures: {', '.join(str(p) for p in pngs)}\n"
          f"vLLM's log: {log}\ntotal {result['total_s']:.0f} s")
    return result


# ----------------------------------------------------------------------------- report


MEDIANS = ("wall_s", "tokens", "engine_steps", "projected_ms", "host_counted_ms",
           "host_core_ms", "host_worker_ms", "samples", "kept", "kept_mean_reward",
           "kept_mean_length", "draft_proposed", "draft_accepted")
DIAGNOSTICS = ("loss_samples_mean", "zero_adv_groups", "ess_fraction", "eps_weight_share")


def summarize(runs: list[Run], base: str) -> list[dict]:
    """Medians over repeats, and speed-ups over ``base`` (its time over the config's)."""
    by: dict[str, list[Run]] = {}
    for r in runs:
        by.setdefault(r.config, []).append(r)
    rows = []
    for name, rs in by.items():
        row = {"config": name, "repeats": len(rs),
               **{k: statistics.median(getattr(r, k) for r in rs) for k in MEDIANS},
               **{k: statistics.median(r.diagnostics.get(k, 0.0) for r in rs)
                  for k in DIAGNOSTICS}}
        reasons: dict[str, int] = {}
        for r in rs:
            for k, v in r.reasons.items():
                reasons[k] = reasons.get(k, 0) + v
        row["reasons"] = {k: v / len(rs) for k, v in reasons.items()}
        row["asynchronous"] = rs[0].asynchronous
        rows.append(row)
    b = next(r for r in rows if r["config"] == base)
    for row in rows:
        row["cpu_speedup"] = b["wall_s"] / row["wall_s"]
        row["gpu_speedup"] = b["projected_ms"] / row["projected_ms"]
        row["host_speedup"] = b["host_counted_ms"] / row["host_counted_ms"]
    return rows


def header(args, model: str, n_prompts: int, duet: dict, arrol: dict, plans: dict) -> str:
    ns = [p.n for p in plans.values()]
    shortest = sum(p.mode == "shortest" for p in plans.values())
    auc = arrol.get("arrol/heldout_auc", float("nan"))
    return (f"\n{model}\n{n_prompts} held-out prompts, M = {args.m} kept per prompt, "
            f"max_tokens {args.max_tokens}, temperature 1, one step per configuration "
            f"(median of {args.repeats}), interleaved with stock vLLM, in-process engines"
            f"{' with H100 scheduler limits' if args.gpu_limits else ''}.\n"
            f"Previous steps gave DARTS M' = {min(ns)}..{max(ns)} (mean {statistics.fmean(ns):.1f}"
            f", {shortest} of {len(ns)} prompts saturated: shortest-only), DUET K1/K2 = "
            f"{duet['k1']}/{duet['k2']}, ARRoL's head held-out AUC {auc:.2f} (gate "
            f"{'open' if arrol.get('arrol/gate_open') else 'shut'}).\n"
            f"'GPU ms' is a PROJECTION: the same engine steps priced on the {args.cost} "
            f"step-cost table (not a GPU measurement), forward passes only. '+host ms' adds "
            f"the host time MEASURED on this CPU on each step's critical path (scheduling, "
            f"output processing, drafter, scorer; x {args.host_scale:g}): summed with the "
            f"forward pass where the engine schedules synchronously (sync); where it "
            f"schedules asynchronously (async) the host work overlaps it (max), except a "
            f"drafting DAS step's after it waited for the last step's ids (drafting and "
            f"vLLM's input preparation), which adds. Speed-ups are "
            f"stock-{args.m}'s time over the configuration's.\n")


COLUMNS = (("config", "config", "{}"), ("tokens", "tokens", "{:,.0f}"),
           ("engine_steps", "steps", "{:.0f}"), ("kept", "kept", "{:.0f}"),
           ("kept_mean_reward", "kept reward", "{:.3f}"),
           ("kept_mean_length", "kept len", "{:.1f}"),
           ("loss_samples_mean", "loss/grp", "{:.1f}"), ("zero_adv_groups", "0-adv grps", "{:.2f}"),
           ("ess_fraction", "ESS/n", "{:.2f}"), ("wall_s", "CPU s", "{:.1f}"),
           ("cpu_speedup", "CPU x", "{:.2f}"), ("sched", "sched.", "{}"),
           ("host_ms", "host ms", "{:,.0f}"),
           ("projected_ms", "GPU ms (proj.)", "{:,.0f}"),
           ("host_counted_ms", "+host ms (proj.)", "{:,.0f}"),
           ("gpu_speedup", "GPU x (proj.)", "{:.2f}"),
           ("host_speedup", "+host x (proj.)", "{:.2f}"), ("notes", "technique counts", "{}"))


def notes(r: dict) -> str:
    reasons, n = r["reasons"], max(r["samples"], 1)
    out = []
    for key, label in (("darts_cancelled", "cancelled"), ("duet_aborted", "duet aborted"),
                       ("duet_trimmed", "trimmed"), ("arrol_pruned", "pruned")):
        if reasons.get(key):
            out.append(f"{label} {reasons[key] / n:.0%}")
    if r.get("draft_proposed"):
        out.append(f"drafts accepted {r['draft_accepted'] / r['draft_proposed']:.0%}")
    return ", ".join(out)


def table(rows: list[dict], base: str) -> str:
    """A markdown table, one row per configuration."""
    lines = ["| " + " | ".join(h for _, h, _ in COLUMNS) + " |",
             "|" + "---|" * len(COLUMNS)]
    for r in rows:
        host = (r["host_core_ms"] + r["host_worker_ms"]) if "host_core_ms" in r else None
        sched = {True: "async", False: "sync"}.get(r.get("asynchronous"))
        r = {**r, "notes": notes(r), "host_ms": host, "sched": sched}
        lines.append("| " + " | ".join("–" if r.get(k) is None else fmt.format(r[k])
                                       for k, _, fmt in COLUMNS) + " |")
    return "\n".join(lines)


def pictures(runs: list[Run], args, out_dir: Path, stamp: str) -> list[Path]:
    """The length CDF and running samples over the step (first repeat of each config)."""
    from vllm_rl.bench import plots

    first: dict[str, Run] = {}
    for r in runs:
        first.setdefault(r.config, r)
    title = f"{args.prompts} prompts, M = {args.m}, max_tokens {args.max_tokens}"
    cdf = plots.length_cdf({n: r.lengths for n, r in first.items()},
                           out_dir / f"step-{stamp}-lengths.png",
                           f"Generated length per sample, one rollout step ({title})",
                           args.max_tokens)
    by_step = {n: (list(range(len(r.batch_profile))), r.batch_profile)
               for n, r in first.items()}
    run = plots.running(by_step, out_dir / f"step-{stamp}-running.png",
                        f"Samples running in each engine step of one rollout step ({title})",
                        "engine step")
    return [cdf, run, timeline_png(first, args, out_dir / f"step-{stamp}-timeline.png")]


TIMELINE_STEPS = slice(20, 60)     # a stretch in the bulk of the step


def timeline_png(first: dict, args, path: Path) -> Path:
    """Forty engine steps of stock vLLM and of the DAS configurations, laid out in time
    (:func:`vllm_rl.bench.plots.timeline`), and the DAS steps priced as a synchronous
    engine would run them: the overlap async scheduling buys."""
    from vllm_rl.bench import plots

    lanes = {}
    for name, r in first.items():
        if not (name == f"stock-{args.m}" or engine_kind(name) == "das") or not r.timeline:
            continue
        t = r.timeline
        parts = tuple(t.get(k, [0.0] * len(t["gpu_ms"]))[TIMELINE_STEPS]
                      for k in ("gpu_ms", "core_ms", "worker_ms", "path_ms"))
        lanes[f"{name} ({'async' if r.asynchronous else 'sync'}, as run)"] = \
            (*parts, bool(r.asynchronous))
        if name != f"stock-{args.m}" and r.asynchronous:
            lanes[f"{name}, the same steps scheduled synchronously"] = (*parts, False)
    return plots.timeline(lanes, path, f"Engine steps {TIMELINE_STEPS.start}-"
                          f"{TIMELINE_STEPS.stop} of one rollout step ({args.prompts} "
                          f"prompts x {args.m}), host x {args.host_scale:g}")


__all__ = ["Run", "main", "parser", "run_once", "summarize", "table"]
