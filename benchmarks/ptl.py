"""Measure the per-token latency curve PTL(batch size) of the running engine (DARTS App. A).

    python benchmarks/ptl.py [--model PATH] [--sizes 1,2,4,...] [--out ptl.json]

For each batch size b it decodes b requests in lockstep (``ignore_eos``) for two output
lengths and takes PTL(b) = (t(T2) - t(T1)) / (T2 - T1), the time of one decode step
with prefill cancelled out.  It fits the project's one step-cost model to the points
(:class:`vllm_rl.cost.OnlineCost`, read as PTL(B) by ``StepCost.ptl``: DARTS's Eq. 4 and
Eq. 6-9 plan with it) and writes points and fit as JSON.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def decode_time(llm, prompts: list[str], tokens: int) -> float:
    from vllm import SamplingParams

    sp = SamplingParams(max_tokens=tokens, min_tokens=tokens, ignore_eos=True, temperature=1.0,
                        seed=0)
    t0 = time.perf_counter()
    llm.generate(prompts, sp, use_tqdm=False)
    return time.perf_counter() - t0


def measure(llm, sizes: list[int], t1: int, t2: int, repeats: int) -> list[tuple[int, float]]:
    from vllm_rl.task import train_prompts

    pool = train_prompts(max(sizes))
    points = []
    for b in sizes:
        prompts = pool[:b]
        decode_time(llm, prompts, 4)  # warm this batch shape
        best = min((decode_time(llm, prompts, t2) - decode_time(llm, prompts, t1)) / (t2 - t1)
                   for _ in range(repeats))
        points.append((b, max(best, 1e-9)))
        print(f"bsz {b:5d}  PTL {best * 1e3:8.3f} ms/step", flush=True)
    return points


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="model path or id (default: the embedded "
                    "demo model, vllm_rl.task.MODEL_PATH)")
    ap.add_argument("--sizes", default="1,2,4,8,16,32,64,128,256,512")
    ap.add_argument("--t1", type=int, default=16)
    ap.add_argument("--t2", type=int, default=80)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "bench-results" / "ptl.json"))
    args = ap.parse_args()

    from vllm_rl.cost import OnlineCost
    from vllm_rl.llm import LLM
    from vllm_rl.task import MODEL_PATH

    llm = LLM(args.model or MODEL_PATH, seed=0, max_model_len=1024)
    points = measure(llm, [int(s) for s in args.sizes.split(",")], args.t1, args.t2, args.repeats)
    # the project's one PTL model: a step-cost model (here fitted to these decode steps,
    # as the engine's OnlineCost fits its own) read as PTL(B) (StepCost.ptl)
    cost = OnlineCost()
    context = (args.t1 + args.t2) // 2
    for b, ptl in points:
        cost.observe([1] * b, [context] * b, ptl * 1e3)
    fitted = cost.ptl(context)
    for b, ptl in points:
        print(f"bsz {b:5d}  measured {ptl * 1e3:8.3f} ms  cost model {fitted(b):8.3f} ms")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"points": points, "context": context,
                               "fitted_ms": {b: fitted(b) for b, _ in points}}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
