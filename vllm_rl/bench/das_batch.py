"""Where does drafting stop paying?  DAS throughput with and without drafts per batch size.

    vllm-rl bench das-batch [--sizes 1,4,16,64,128,256,512] [--repeats 2]

Verification makes every forward pass carry the draft tokens too; on a small batch the
per-pass base cost dominates and accepted drafts save whole passes, on a large one the
per-token cost dominates and drafts only add work (DAS Eq. 1-2).  This measures the
crossover on this machine, for :class:`vllm_rl.das.config.DASConfig`'s ``full_batch``
and ``off_batch`` (the batch cap).

One DAS engine with the cap switched off.  An untimed epoch (8 samples of each of the 64
held-out prompts, problem id = prompt) fills the trees.  Then, for each batch size B, B
samples (prompt i mod 64, its own seed) run to their natural end at temperature 1 with
``das.policy="fixed"`` (2b = 8 draft tokens whenever the tree has a continuation) and
with ``das.budget=0`` (no drafts, same engine, same seeds, same flags otherwise),
interleaved.  It
reports tokens per second of both, their ratio, accepted tokens per draft token, and
the suggested ``full_batch`` (largest B where drafting still gains >= 10%) and
``off_batch`` (smallest larger B where it gains < 2%; none if it never drops that low).
B is the batch a run starts with; it shrinks as samples finish, as in a rollout.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path



def run(llm, prompts, size: int, seed: int, das: dict, max_tokens: int) -> dict:
    from vllm import SamplingParams

    from vllm_rl import rl_params

    ps, params = [], []
    for j in range(size):
        i = j % len(prompts)
        ps.append(prompts[i])
        params.append(SamplingParams(temperature=1.0, max_tokens=max_tokens, seed=seed + j,
                                     extra_args=rl_params(das={"problem_id": f"b{i}", **das})))
    t0 = time.perf_counter()
    outs = llm.generate(ps, params, use_tqdm=False)
    wall = time.perf_counter() - t0
    infos = [o.outputs[0].rollout_info for o in outs]
    tokens = sum(i.length for i in infos)
    return {"wall_s": wall, "tokens": tokens, "tok_s": tokens / wall,
            "proposed": sum(i.draft_proposed for i in infos),
            "accepted": sum(i.draft_accepted for i in infos)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="vllm-rl bench das-batch",
                                 description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1,4,16,64,128,256,512",
                    help="batch sizes B, comma-separated (default 1,4,16,64,128,256,512)")
    ap.add_argument("--repeats", type=int, default=3,
                    help="interleaved repeats per size; medians reported (default 3)")
    ap.add_argument("--max-tokens", type=int, default=128, help="(default 128)")
    from vllm_rl.task.kits import add_argument as add_task_argument

    add_task_argument(ap)
    ap.add_argument("--out", default="bench-results/das_batch.json", help="the JSON file")
    args = ap.parse_args(argv)

    from vllm import SamplingParams

    from vllm_rl import LLM, rl_params
    from vllm_rl.task import kit

    task = kit(args.task)
    llm = LLM(task.model_path, max_model_len=task.max_model_len,
              das={"full_batch": 1 << 20, "off_batch": 1 << 20}, use_tqdm_on_load=False)
    prompts = task.heldout_prompts(64)
    extra = [rl_params(das={"problem_id": f"b{i}", "policy": "fixed"}) for i in range(64)]
    llm.generate(prompts, [SamplingParams(n=8, temperature=1.0, max_tokens=args.max_tokens,
                                          seed=99, extra_args=e) for e in extra], use_tqdm=False)
    rows = []
    for size in map(int, args.sizes.split(",")):
        on, off = [], []
        for rep in range(args.repeats):
            seed = 1000 * size + 10 * rep
            on.append(run(llm, prompts, size, seed, {"policy": "fixed"}, args.max_tokens))
            off.append(run(llm, prompts, size, seed, {"budget": 0}, args.max_tokens))
        tok_on = statistics.median(r["tok_s"] for r in on)
        tok_off = statistics.median(r["tok_s"] for r in off)
        verif = sum(r["proposed"] for r in on)
        rows.append({"batch": size, "tok_s_no_draft": tok_off, "tok_s_draft": tok_on,
                     "ratio": tok_on / tok_off,
                     "accepted_per_draft_token": sum(r["accepted"] for r in on) / max(verif, 1),
                     "runs_draft": on, "runs_no_draft": off})
        print(f"B={size:4d}  no draft {tok_off:8.0f} tok/s  draft {tok_on:8.0f} tok/s  "
              f"ratio {tok_on / tok_off:5.2f}", flush=True)
    full = max((r["batch"] for r in rows if r["ratio"] >= 1.1), default=0)
    losing = [r["batch"] for r in rows if r["ratio"] < 1.02 and r["batch"] > full]
    off_at = min(losing) if losing else None
    largest = rows[-1]["batch"]
    shown = off_at if off_at is not None else f"above {largest}"
    print(f"\nsuggested DASConfig(full_batch={full}, off_batch={shown})")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"args": vars(args), "rows": rows,
                                          "full_batch": full, "off_batch": off_at}, indent=2))
    print(f"wrote {args.out}")

