"""``vllm-rl bench step``: one RL rollout step per configuration, against stock vLLM.

Three in-process engines on the same model (:mod:`vllm_rl.bench.engines`), each configuration on the
one a user would build for it (:func:`vllm_rl.bench.matrix.engine_kind`): stock vLLM
(its own scheduler, with the step trace only), the RL engine without the DAS drafter
(DARTS, DUET, ARRoL alone) and the DAS engine (every configuration that drafts), both
RL engines with ARRoL's head; all three schedule asynchronously, as on a GPU.  The step
is run as a trainer runs it:

1. **Previous steps** (untimed, ``--history``, two by default): M samples per prompt on
   the RL engine, with DAS (each problem's tree fills) and ARRoL scoring.  The prompts are
   the fixed held-out set, or with ``--prompt-seed`` prompts drawn outside the training
   pool and that set (ones no default was chosen on).  From their records: DARTS's length
   statistics per prompt (:class:`vllm_rl.darts.DartsPlanner`), DUET's K1/K2 as the
   engine's own estimate would give them (p30/p80 of the natural lengths, cut-short
   samples censored: :func:`vllm_rl.duet.rule.km_quantile`), and ARRoL's head and
   calibration (:class:`vllm_rl.arrol.ArrolFeedback`: the second step's scores are the
   held-out check of the head the first one trained).
2. **The timed step**: every configuration (:mod:`vllm_rl.bench.matrix`) on the same prompts with the
   same seeds, interleaved with the stock baselines, ``--repeats`` times.  Before each
   one on the DAS engine its trees are put back as the previous steps left them
   (:func:`vllm_rl.bench.step.run.reset_trees`), so no configuration drafts from another's rollouts.  A
   configuration with partial rollouts (``+partial``) runs two untimed steps of its own
   first, so the timed step is one with carried samples, as in training; its groups are
   the complete ones (:func:`vllm_rl.bench.step.run.run_once`).  With ``--host-load N``
   every timed step, stock's too, runs beside N processes spinning on this process's
   CPUs (:mod:`vllm_rl.bench.host_load`): a busy host.

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
import json
import time
from dataclasses import asdict
from pathlib import Path

from vllm_rl.bench.host_load import HostLoad
from vllm_rl.bench.matrix import CONFIGS, engine_kind, is_config
from vllm_rl.bench.step.report import header, pictures, summarize, table
from vllm_rl.bench.step.run import previous_steps, reset_trees, run_once, step_params
from vllm_rl.das.config import BATCH_CAPS
from vllm_rl.task.kits import add_argument as add_task_argument

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


def history_steps(text: str) -> int:
    """``--history``: earlier steps before the timed one, at least 1."""
    steps = int(text)
    if steps < 1:
        raise argparse.ArgumentTypeError("at least 1 earlier step (DUET's thresholds and "
                                         "DARTS's lengths come from it)")
    return steps


def parser(prog: str = "vllm-rl bench step") -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", default=",".join(c for c in CONFIGS if c != "stock"),
                    help=f"comma-separated, among {', '.join(CONFIGS[1:] + EXTRA)} (the "
                         "stock baselines always run)")
    ap.add_argument("--prompts", type=int, default=16, help="held-out prompts (default 16)")
    ap.add_argument("--prompt-seed", type=int, default=None,
                    help="draw the prompts with this seed outside the training pool and the "
                         "fixed held-out set, prompts no default was chosen on (default: the "
                         "fixed held-out set)")
    ap.add_argument("--history", type=history_steps, default=2,
                    help="earlier steps of the same prompts before the timed one, each M "
                         "samples a prompt: DAS's trees, DARTS's lengths, DUET's K1/K2 and "
                         "ARRoL's head come from them (default 2; at least 1)")
    ap.add_argument("--m", type=int, default=8, help="training group size M (default 8)")
    add_task_argument(ap)
    ap.add_argument("--max-tokens", type=int, default=None,
                    help="the response limit (default: the kit's, 256 or 1,024)")
    ap.add_argument("--l-detect", type=int, default=None,
                    help="ARRoL's l_detect (default: the kit's, 24 or 64)")
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
    ap.add_argument("--host-load", type=int, default=0, metavar="N",
                    help="N processes spinning on this process's CPUs during the timed "
                         "steps, stock's and every configuration's: a busy host "
                         "(vllm_rl.bench.host_load; default 0)")
    ap.add_argument("--das-batch-cap", default=None, choices=BATCH_CAPS,
                    help="the DAS engine's batch cap (DASConfig.batch_cap; default the "
                         "engine's, 'confidence')")
    ap.add_argument("--das-config", default=None, metavar="JSON",
                    help="more DASConfig fields for the DAS engine, e.g. "
                         "'{\"lookahead\": false}' (default: the engine's)")
    ap.add_argument("--model", default=None, help="model path (default: the kit's model)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="bench-results", help="folder for JSON, PNGs, vllm.log")
    return ap


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
    from vllm_rl.task.kits import kit

    task = kit(args.task)
    args.max_tokens = args.max_tokens or task.max_tokens
    args.l_detect = args.l_detect or task.l_detect
    model = args.model or str(task.model_path)
    prompts = (task.heldout_prompts(args.prompts) if args.prompt_seed is None
               else task.outside_prompts(args.prompt_seed, args.prompts))
    context = max(1024, task.max_model_len)
    bar = tqdm(total=4, desc="vllm-rl bench step", unit="stage", dynamic_ncols=True)
    bar.set_postfix_str("starting engines (stock vLLM, RL, RL with DAS)")
    kv = int(args.kv_gib * (1 << 30))
    stock = stock_engine(model, args.seed, args.gpu_limits, kv, max_model_len=context)
    das = {**({"batch_cap": args.das_batch_cap} if args.das_batch_cap else {}),
           **(json.loads(args.das_config) if args.das_config else {})} or True
    kinds = {engine_kind(n) for n in names}
    rl = rl_engine(model, args.seed, args.gpu_limits, kv, max_model_len=context, das=das,
                   cost=args.cost)
    plain = (rl_engine(model, args.seed, args.gpu_limits, kv, max_model_len=context, das=None,
                       cost=args.cost)
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
        params = step_params(name, prompts, args, plans, duet)
        with HostLoad(args.host_load):
            runs.append(run_once(llm, name, params, prompts, rep, cost, args.host_scale))
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


__all__ = ["main", "parser", "run_once", "summarize", "table"]


if __name__ == "__main__":
    main()
