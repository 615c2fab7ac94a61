"""One RL rollout step priced for the GPU: every configuration against stock vLLM at the same kept M.

    python benchmarks/gpu_step.py                      # all configurations, embedded model
    python benchmarks/gpu_step.py --configs darts-16,das-fixed-phase,das-fixed-cost --table h100

Every engine runs in-process on this machine with the scheduler limits vLLM uses on an
H100 (``max_num_seqs`` 1024, ``max_num_batched_tokens`` 16384: the offline defaults of
``EngineArgs`` for a >= 70 GiB GPU), so batch shapes are the GPU's.  Each engine records
every step it runs (:mod:`vllm_rl.engine.trace`: per sequence the query tokens and the
cached context), and the same steps are priced with a measured step-cost table
(:mod:`vllm_rl.cost`, default the H100 table for Qwen3-8B and Qwen3-1.7B shapes).  The
projected times are labelled as projections: same engine decisions, GPU step costs, no
host overhead.  CPU wall time is reported beside them.

The step is run as a trainer runs it: a *previous* step (8 samples per prompt, untimed)
gives the DARTS controller its per-prompt length statistics (``control.darts``), DUET its
K1 = p30 and K2 = p80 of the kept lengths (App. A.3), and DAS its per-problem trees.
Then every configuration generates the training groups of the same prompts with the
same seeds: ``M`` = 8 kept samples per prompt.

Configurations (stock ones on stock vLLM's scheduler with the trace only):

- ``stock-8``: n = 8, the baseline every ratio is against (``stock-16``: n = 16);
- ``darts-16``: M' = 16, keep the 8 shortest, exact early stop;
- ``darts-adaptive``: M' per prompt from Alg. 1 / App. B with the cost slope k of Eq. 6
  from the table's PTL (``plan``), fed by the previous step's lengths; the total budget
  is the one whose plan has the smallest Eq. 4 step cost on the table
  (``control.darts.choose_budget``; 1.0 = no redundancy, when the batch is past the
  flat part of the GPU's step-cost curve);
- ``duet``: n = 8 with the marker gate;
- ``das-class`` / ``das-fixed`` / ``das-optimal``: n = 8, each DAS budget policy, all
  under the engine's default batch cap (``DASConfig().batch_cap``);
- ``das-fixed-phase``: fixed budgets under the phase-aware cap (``batch_cap="phase"``:
  per request the draft length that makes each step cheapest per generated token on
  the table, from its acceptance estimate, ``control.das.phase_budgets``);
- ``das-fixed-cost``: fixed budgets under the uniform cost cap (``batch_cap="cost"``,
  one length for every request from the engine's recent acceptance: the default
  before the phase-aware cap);
- ``das-fixed-linear``: the linear batch cap (full budgets up to 256 running);
- ``das-off``: the default DAS engine, requests with ``das.budget = 0`` (trees fed,
  nothing drafted: what the drafter's engine costs without drafts);
- ``all``: DARTS (adaptive) + DUET + DAS (the engine's default policy and cost cap) in
  one request; ``all-16``: the same with M' = 16 for every prompt.

Output: a table (projected ms on each shape, ratio to ``stock-8``, engine steps, tokens,
CPU wall, kept samples, their mean reward and length), a JSON file and a PNG of the
projected batch-size profile over the step under ``bench-results/``.
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

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# vLLM's offline defaults on an H100 (EngineArgs, >= 70 GiB and not an A100).
H100_LIMITS = {"max_num_seqs": 1024, "max_num_batched_tokens": 16384}
TASK_MARKER = r"\\boxed\{[^}]*\}"
SHAPES = ("qwen3-8b", "qwen3-1.7b")


@dataclass
class StepRun:
    config: str
    engine: str
    wall_s: float
    engine_steps: int
    tokens: int
    samples: int
    kept: int
    kept_weight: float
    kept_mean_reward: float
    kept_mean_length: float
    projected_ms: dict[str, float] = field(default_factory=dict)
    reasons: dict[str, int] = field(default_factory=dict)
    batch_profile: list[int] = field(default_factory=list)
    stop_wait_steps: int = 0
    groups_stopped: int = 0
    draft_accepted: int = 0
    draft_proposed: int = 0
    # per sample: prompt index, prompt tokens, output tokens, drafts proposed, accepted
    sample_rows: list = field(default_factory=list)


def das_engine_of(name: str) -> str | None:
    """The DAS engine (``"das-<batch cap>"``) configuration ``name`` runs on, or None."""
    from vllm_rl.spec.config import BATCH_CAPS, DASConfig

    if not (name.startswith("das-") or name.startswith("all")):
        return None
    cap = name.rsplit("-", 1)[-1]
    return f"das-{cap if cap in BATCH_CAPS else DASConfig().batch_cap}"


def make_engines(names: set[str], model: str, seed: int, table: str, das_budget: int,
                 kv_bytes: int):
    import vllm

    from vllm_rl import LLM
    from vllm_rl.engine.trace import TRACED_SCHEDULER_CLS

    common = dict(seed=seed, max_model_len=1024, kv_cache_memory_bytes=kv_bytes, **H100_LIMITS)
    out = {"stock": vllm.LLM(model, scheduler_cls=TRACED_SCHEDULER_CLS, async_scheduling=True,
                             additional_config={"vllm_rl_trace": True}, **common)}
    if names & {"darts-16", "darts-adaptive", "duet"}:
        out["rl"] = LLM(model, trace=True, **common)
    for engine in sorted({e for e in map(das_engine_of, names) if e}):
        # every DAS engine plans on the same table it is projected on
        out[engine] = LLM(model, trace=True, das={"budget": das_budget,
                                                   "batch_cap": engine.split("-", 1)[1]},
                          cost=f"{table}:{SHAPES[0]}", **common)
    return out


def previous_step(llm, prompts, m, max_tokens, seed, das: bool):
    """The trainer's previous step: lengths per prompt (DARTS, DUET) and, on a DAS engine,
    the problems' trees."""
    from vllm import SamplingParams

    from vllm_rl import rl_params

    params = [SamplingParams(n=m, temperature=1.0, max_tokens=max_tokens, seed=seed + i,
                             extra_args=rl_params(das={"problem_id": f"p{i}"}) if das else None)
              for i in range(len(prompts))]
    outs = llm.generate(prompts, params, use_tqdm=False)
    return [[len(c.token_ids) for c in o.outputs] for o in outs], \
        [[len(c.token_ids) for c in o.outputs if c.finish_reason == "stop"] for o in outs]


def flags_for(name: str, i: int, plan, duet: dict, m: int, m_prime: int):
    """(n, extra_args) of prompt ``i`` under configuration ``name``."""
    from vllm_rl import rl_params

    das = {"problem_id": f"p{i}"}
    if name == "stock-8":
        return m, None
    if name == "stock-16":
        return m_prime, None
    if name == "darts-16":
        return m_prime, rl_params(group={"size": m}, darts={"mode": "shortest"})
    if name == "darts-adaptive":
        return plan[i].n, rl_params(group={"size": m, "redundant": plan[i].n},
                                    darts={"mode": "shortest"})
    if name == "duet":
        return m, rl_params(duet=duet)
    if name == "das-off":
        return m, rl_params(das={**das, "budget": 0})
    if name.startswith("das-"):
        policy = name.split("-")[1]
        return m, rl_params(das={**das, "policy": policy})
    if name == "all":
        return plan[i].n, rl_params(group={"size": m, "redundant": plan[i].n},
                                    darts={"mode": "shortest"}, duet=duet, das=das)
    if name == "all-16":
        return m_prime, rl_params(group={"size": m}, darts={"mode": "shortest"}, duet=duet,
                                  das=das)
    raise ValueError(name)


def run_config(llm, name: str, prompts, plan, duet, args, costs) -> StepRun:
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    from vllm_rl.engine.trace import engine_scheduler, engine_trace
    from vllm_rl.llm import attach_rollout_info
    from vllm_rl.task import reward

    sched = engine_scheduler(llm)
    trace = engine_trace(llm)
    mark = trace.mark()
    rl_stats = dict(getattr(sched, "rl_stats", {}))
    engine = llm.llm_engine
    params, ids, outputs = [], {}, {}
    t0 = time.perf_counter()
    for i, prompt in enumerate(prompts):
        n, extra = flags_for(name, i, plan, duet, args.m, args.m_prime)
        sp = SamplingParams(n=n, temperature=1.0, max_tokens=args.max_tokens,
                            seed=args.seed + 7919 * i, extra_args=extra,
                            output_kind=RequestOutputKind.FINAL_ONLY)
        params.append(sp)
        rid = f"{name}-{i}"
        ids[rid] = i
        engine.add_request(rid, prompt, sp)
    steps = 0
    while engine.has_unfinished_requests():
        steps += 1
        for out in engine.step():
            if out.finished:
                outputs[ids[out.request_id]] = out
    wall = time.perf_counter() - t0
    outs = [outputs[i] for i in range(len(prompts))]
    attach_rollout_info(outs, params)
    step_trace = trace.since(mark)
    kept, weight, reasons, tokens, samples, accepted, proposed = [], 0.0, {}, 0, 0, 0, 0
    rows = []
    for i, (prompt, out) in enumerate(zip(prompts, outs)):
        for c in out.outputs:
            info = c.rollout_info
            samples += 1
            tokens += len(c.token_ids)
            accepted += info.draft_accepted or 0
            proposed += info.draft_proposed or 0
            rows.append([i, len(out.prompt_token_ids), len(c.token_ids),
                         info.draft_proposed or 0, info.draft_accepted or 0])
            reasons[info.reason.value] = reasons.get(info.reason.value, 0) + 1
            if info.weight > 0:
                kept.append((reward(prompt, c.text), len(c.token_ids)))
                weight += info.weight
    after = getattr(sched, "rl_stats", {})
    return StepRun(
        name, "", wall, len(step_trace), tokens, samples, len(kept), weight,
        statistics.fmean(r for r, _ in kept) if kept else 0.0,
        statistics.fmean(n for _, n in kept) if kept else 0.0,
        {shape: step_trace.project(cost).total_ms for shape, cost in costs.items()},
        reasons, [len(w) for w, _ in step_trace.steps()],
        after.get("stop_wait_steps", 0) - rl_stats.get("stop_wait_steps", 0),
        after.get("groups_stopped", 0) - rl_stats.get("groups_stopped", 0), accepted,
        proposed, rows)


ALL = ["stock-8", "stock-16", "darts-16", "darts-adaptive", "duet", "das-class", "das-fixed",
       "das-optimal", "das-fixed-phase", "das-fixed-cost", "das-fixed-linear", "das-off", "all",
       "all-16"]


def engine_of(name: str) -> str:
    """The engine a configuration runs on."""
    if name.startswith("stock"):
        return "stock"
    return das_engine_of(name) or "rl"


BUDGETS = (1.0, 1.125, 1.25, 1.5, 2.0)   # total budgets (x M N) the auto choice weighs


def darts_plan(lengths_by_prompt, m, costs, lam_budget: str, max_tokens: int):
    """Alg. 1 / App. B from the previous step's lengths, k of Eq. 6 from the table's PTL.

    The total budget: ``lam_budget`` (x M N), or ``"auto"``: the candidate in
    :data:`BUDGETS` whose plan has the smallest Eq. 4 step cost on the table's PTL
    (:func:`vllm_rl.control.darts.choose_budget`) -- redundancy only where the hardware
    makes the cut tail worth the wider batch.
    """
    from vllm_rl.control import darts

    stats = darts.LengthStats()
    for i, ls in enumerate(lengths_by_prompt):
        stats.update(i, ls)
    stats.end_step()
    cost = costs[SHAPES[0]]
    flat = [x for ls in lengths_by_prompt for x in ls]
    n = len(lengths_by_prompt)
    ptl = cost.ptl(statistics.fmean(flat))
    k = darts.cost_slope(ptl, flat, m, n)

    def plan_for(budget: float):
        lam = darts.lambda_for_budget(stats.rho(), k, budget * m * n)
        return darts.plan(list(range(n)), stats, m, lam, k)

    if lam_budget == "auto":
        budget, _, _ = darts.choose_budget(
            BUDGETS, lambda b: [p.n for p in plan_for(b)], lengths_by_prompt, m, ptl,
            max_tokens)
    else:
        budget = float(lam_budget)
    return plan_for(budget), k, budget


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--m", type=int, default=8)
    ap.add_argument("--m-prime", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--table", default="h100", help="step-cost table (vllm_rl.cost.load_cost)")
    ap.add_argument("--das-budget", type=int, default=4, help="DAS engine's b (2b drafts)")
    ap.add_argument("--darts-budget", default="1.25",
                    help="darts-adaptive and all: total budget x M N, or 'auto': the one "
                         "whose plan has the smallest Eq. 4 step cost on the table (its "
                         "predictor is optimistic about cut tails: see the README)")
    ap.add_argument("--configs", default=",".join(ALL))
    ap.add_argument("--kv-gib", type=float, default=3.0,
                    help="KV cache per engine, GiB (3, the default, holds the H100 "
                         "limits' 1024 running sequences at max_tokens 256 on the embedded "
                         "model; lower it for small runs)")
    ap.add_argument("--out", default=str(ROOT / "bench-results"))
    args = ap.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    __import__("quiet").quiet_vllm(args.out)         # vLLM's log lines to a file
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

    from tqdm import tqdm

    from vllm_rl.cost import load_cost
    from vllm_rl.task import MODEL_PATH, heldout_prompts

    names = [n for n in args.configs.split(",") if n]
    unknown = set(names) - set(ALL)
    if unknown:
        ap.error(f"unknown configuration(s) {sorted(unknown)}; choose from {ALL}")
    if "stock-8" not in names:
        names.insert(0, "stock-8")
    model = args.model or str(MODEL_PATH)
    costs = {shape: load_cost(f"{args.table}:{shape}") for shape in SHAPES}
    llms = make_engines(set(names), model, args.seed, args.table, args.das_budget,
                        int(args.kv_gib * (1 << 30)))
    prompts = heldout_prompts(args.prompts)

    # The previous step: on the default DAS engine when there is one (its lengths feed
    # DARTS and DUET), and on every DAS engine (each grows its own trees).
    das_engines = sorted(e for e in llms if e.startswith("das-"))
    default = das_engine_of("das-fixed")
    first = default if default in llms else (das_engines[0] if das_engines else None)
    prev_llm = llms[first] if first else llms.get("rl") or llms["stock"]
    lengths, valid_lengths = previous_step(prev_llm, prompts, args.m, args.max_tokens,
                                           args.seed + 100_000, first is not None)
    for engine in das_engines:
        if engine != first:
            previous_step(llms[engine], prompts, args.m, args.max_tokens,
                          args.seed + 100_000, True)
    from vllm_rl.control.duet import percentile

    kept_prev = [x for ls in valid_lengths for x in ls]
    duet = {"k1": round(percentile(kept_prev, 30)), "k2": round(percentile(kept_prev, 80)),
            "grace": max(1, round(150 * args.max_tokens / 3072)), "eps": 0.05,
            "pattern": TASK_MARKER}
    plan, k_cost, budget = darts_plan(lengths, args.m, costs, args.darts_budget,
                                      args.max_tokens)
    runs = []
    for name in tqdm(names, desc="configurations", unit="step"):
        run = run_config(llms[engine_of(name)], name, prompts, plan, duet, args, costs)
        run.engine = engine_of(name)
        runs.append(run)
    base = next(r for r in runs if r.config == "stock-8")
    rows = []
    for r in runs:
        row = {"config": r.config, **{f"{s} ms": r.projected_ms[s] for s in SHAPES},
               **{f"vs stock-8 ({s})": base.projected_ms[s] / r.projected_ms[s] for s in SHAPES},
               f"{SHAPES[0]} ms/ktok": 1e3 * r.projected_ms[SHAPES[0]] / max(r.tokens, 1),
               "drafts acc": r.draft_accepted,
               "steps": r.engine_steps, "wait steps": r.stop_wait_steps, "tokens": r.tokens, "cpu s": r.wall_s,
               "cpu vs stock-8": base.wall_s / r.wall_s, "kept": r.kept,
               "kept reward": r.kept_mean_reward, "kept len": r.kept_mean_length}
        rows.append(row)
    print(f"\nmodel {model}; {len(prompts)} prompts; M = {args.m} kept per prompt; "
          f"max_tokens {args.max_tokens}; engine limits {H100_LIMITS}; "
          f"PROJECTED GPU ms from the {args.table} step-cost table (same engine steps, GPU "
          f"costs, no host overhead); ratios are speed-ups over stock-8 (>1 is faster)")
    print(f"duet flags {duet}; darts-adaptive M' per prompt: mean "
          f"{statistics.fmean(p.n for p in plan):.2f} (min {min(p.n for p in plan)}, max "
          f"{max(p.n for p in plan)}), total budget {budget:g} x M N "
          f"({args.darts_budget}), Eq. 6 k = {k_cost:.4g} ms/sample")
    print_table(rows)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime('%Y%m%d-%H%M%S')
    path = out / f"gpu-step-{stamp}.json"
    path.write_text(json.dumps({"args": vars(args), "model": model, "limits": H100_LIMITS,
                                "duet": duet, "plan": [p.n for p in plan], "rows": rows,
                                "runs": [asdict(r) for r in runs]}, indent=1))
    png = out / f"gpu-step-{stamp}.png"
    plot(runs, costs, png)
    print(f"\nwrote {path}\nwrote {png}")
    for llm in llms.values():
        llm.llm_engine.engine_core.shutdown()


def print_table(rows: list[dict]) -> None:
    keys = list(rows[0])
    cells = [keys] + [[_fmt(r[k]) for k in keys] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(keys))]
    for row in cells:
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                        for i, (c, w) in enumerate(zip(row, widths))))


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.3f}" if abs(v) < 100 else f"{v:.0f}"
    return str(v)


def plot(runs: list[StepRun], costs, path: Path) -> None:
    """Projected time (8B) per configuration, and the batch size over the step."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no PNG")
        return
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.8))
    base = next(r for r in runs if r.config == "stock-8")
    names = [r.config for r in runs]
    for j, shape in enumerate(SHAPES):
        vals = [r.projected_ms[shape] / 1e3 for r in runs]
        ax1.barh([i + 0.4 * j for i in range(len(runs))], vals, height=0.4, label=shape)
    ax1.set_yticks([i + 0.2 for i in range(len(runs))], names)
    ax1.invert_yaxis()
    ax1.axvline(base.projected_ms[SHAPES[0]] / 1e3, color="k", lw=0.8, ls="--")
    ax1.set_xlabel("projected GPU time of the step, s (H100 table)")
    ax1.legend(loc="lower right", fontsize=8)
    ax1.set_title("one rollout step, M = 8 kept per prompt (projection)")
    ax2.set_prop_cycle(color=plt.cm.tab20.colors)          # a distinct colour per run
    for r in runs:
        ax2.plot(r.batch_profile, label=r.config, lw=1)
    ax2.set_xlabel("engine step")
    ax2.set_ylabel("sequences in the step")
    ax2.set_yscale("log")
    ax2.set_title("batch size over the step")
    ax2.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
