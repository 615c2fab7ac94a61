"""How well the suffix tree's draft probabilities predict acceptance, by prior λ (DAS Sec. 4.1).

    python benchmarks/das_calibration.py [--prompts 128] [--max-tokens 512] [--priors 0,0.5,1]

Samples three rounds of M = 8 rollouts of the held-out prompts from the embedded model
on stock vLLM (temperature 1).  For every third position of every round-3 rollout it
drafts 8 tokens (no cutoff) from a tree of that problem's round-1 and round-2 rollouts and
its 7 round-3 siblings (whole: the engine's trees hold the siblings only as far as they
have run), and bins each draft token by its cumulative probability
prod count(child) / (count(parent) + λ) against whether the rollout continued with the
draft up to it.  Under rejection sampling a drafted token is accepted with the target's
probability of it, which is the chance that a sample continues with it, so a calibrated
λ gives a share equal to each bin's probability.  Prints one row per λ: per bin, the
draft tokens and the share that held.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

PROMPT_TAIL = 16          # DASConfig.prompt_tail
BUDGET = 8                # 2b at the default b = 4


def rollouts(prompts: list[str], rounds: int, max_tokens: int):
    """Per round, per prompt, (prompt token ids, the M outputs' token ids)."""
    from vllm import LLM, SamplingParams

    from vllm_rl.task import MODEL_PATH

    llm = LLM(model=str(MODEL_PATH), max_num_seqs=1024, max_num_batched_tokens=16384, seed=0,
              max_model_len=1024, kv_cache_memory_bytes=3 << 30)
    sp = SamplingParams(n=8, temperature=1.0, max_tokens=max_tokens)
    return [[(list(r.prompt_token_ids), [list(o.token_ids) for o in r.outputs])
             for r in llm.generate(prompts, sp, use_tqdm=False)] for _ in range(rounds)]


def calibration(data, prior: float, bins: int = 10):
    """Per probability bin: (draft tokens, tokens that held)."""
    from vllm_rl.das.tree import SuffixTree

    total, held = [0] * bins, [0] * bins
    for p, (prompt, outs) in enumerate(data[-1]):
        tail = prompt[-PROMPT_TAIL:]
        for i, out in enumerate(outs):
            tree, sid = SuffixTree(32, prior), 0
            for earlier in data[:-1]:
                for o in earlier[p][1]:
                    tree.insert(sid, tail + o)
                    sid += 1
            for j, o in enumerate(outs):
                if j != i:
                    tree.insert(sid, tail + o)
                    sid += 1
            for pos in range(0, len(out) - 1, 3):
                draft = tree.draft_info(tail + out[:pos + 1], BUDGET, 0.0, True)
                ok = True
                for k, (tok, prob) in enumerate(zip(draft.tokens, draft.probs)):
                    at = pos + 1 + k
                    ok = ok and at < len(out) and out[at] == tok
                    b = min(int(prob * bins), bins - 1)
                    total[b] += 1
                    held[b] += ok
    return total, held


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=512)
    ap.add_argument("--priors", default="0,0.25,0.5,1")
    args = ap.parse_args()
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from vllm_rl.task.problems import heldout_prompts

    data = rollouts(heldout_prompts(args.prompts), 3, args.max_tokens)
    print("| λ | " + " | ".join(f"{b / 10:.1f}–{(b + 1) / 10:.1f}" for b in range(10)) + " |")
    print("|---" * 11 + "|")
    for prior in (float(x) for x in args.priors.split(",")):
        total, held = calibration(data, prior)
        cells = [f"{h / t:.2f} ({t:,})" if t else "–" for t, h in zip(total, held)]
        print(f"| {prior:g} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
