"""Train the embedded policy on the CPU (seeded; about 30 minutes on 2 cores).

    python -m vllm_rl.task.train --out vllm_rl/task/model

The policy imitates the noisy teacher traces of :mod:`vllm_rl.task.problems`, so that
sampling it at temperature 1 gives what an RL rollout gives: mixed answers within a
group, an intra-prompt long tail, and repeated structure across samples.
"""
from __future__ import annotations

import argparse
import math
import os
import random
import time
from pathlib import Path

from .problems import EOS, teacher_trace, train_problems
from .tokenizer import build_tokenizer

COMPLETION_CAP = 320   # longer teacher traces are cut (no EOS): the model learns to run on


def model_config(vocab_size: int):
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=vocab_size, hidden_size=256, intermediate_size=768,
        num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4,
        head_dim=64, max_position_embeddings=1024, rope_theta=10000.0,
        tie_word_embeddings=True, bos_token_id=0, eos_token_id=0, pad_token_id=0,
        torch_dtype="float32")


def make_example(tok, problem, rng: random.Random) -> tuple[list[int], int]:
    """Token ids of prompt+completion and the index where the completion starts."""
    prompt_ids = tok.encode(problem.prompt).ids
    trace, _ = teacher_trace(problem, rng)
    comp_ids = tok.encode(" " + trace).ids
    if len(comp_ids) >= COMPLETION_CAP:
        comp_ids = comp_ids[:COMPLETION_CAP]
    else:
        comp_ids = comp_ids + [tok.token_to_id(EOS)]
    return prompt_ids + comp_ids, len(prompt_ids)


def batches(tok, problems, rng, pool: int, token_budget: int):
    """Endless length-bucketed batches of fresh teacher traces."""
    import torch

    while True:
        ex = [make_example(tok, rng.choice(problems), rng) for _ in range(pool)]
        ex.sort(key=lambda e: len(e[0]))
        groups, cur = [], []
        for e in ex:
            if cur and (len(cur) + 1) * len(e[0]) > token_budget:
                groups.append(cur)
                cur = []
            cur.append(e)
        groups.append(cur)
        rng.shuffle(groups)
        for g in groups:
            width = max(len(ids) for ids, _ in g)
            ids = torch.zeros(len(g), width, dtype=torch.long)
            labels = torch.full((len(g), width), -100, dtype=torch.long)
            attn = torch.zeros(len(g), width, dtype=torch.long)
            for i, (seq, start) in enumerate(g):
                ids[i, :len(seq)] = torch.tensor(seq)
                labels[i, start:len(seq)] = torch.tensor(seq[start:])
                attn[i, :len(seq)] = 1
            yield ids, labels, attn


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "model")
    ap.add_argument("--steps", type=int, default=1800)
    ap.add_argument("--minutes", type=float, default=50.0, help="stop early after this long (a safety cap)")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--token-budget", type=int, default=8192)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    import torch
    from tokenizers import Tokenizer
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(args.seed)
    torch.set_num_threads(os.cpu_count() or 1)
    rng = random.Random(args.seed)
    build_tokenizer(args.out)
    tok = Tokenizer.from_file(str(args.out / "tokenizer.json"))
    vocab_size = tok.get_vocab_size()
    model = Qwen3ForCausalLM(model_config(vocab_size))
    print(f"params: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M, vocab {vocab_size}")
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01, betas=(0.9, 0.98))
    warm = 100

    def lr_at(step: int) -> float:
        if step < warm:
            return args.lr * (step + 1) / warm
        frac = min(1.0, (step - warm) / max(1, args.steps - warm))
        return args.lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * frac)))

    data = batches(tok, train_problems(), rng, pool=2048, token_budget=args.token_budget)
    t0, ema = time.time(), None
    model.train()
    for step in range(args.steps):
        ids, labels, attn = next(data)
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(input_ids=ids, attention_mask=attn, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        ema = loss.item() if ema is None else 0.98 * ema + 0.02 * loss.item()
        elapsed = time.time() - t0
        if step % 50 == 0:
            print(f"step {step} loss {ema:.4f} lr {lr_at(step):.2e} {elapsed / 60:.1f} min", flush=True)
        if elapsed > args.minutes * 60:
            print(f"time cap reached at step {step}")
            break
    model.save_pretrained(args.out, safe_serialization=True)
    model.generation_config.save_pretrained(args.out)
    print(f"saved to {args.out} after {(time.time() - t0) / 60:.1f} min, loss {ema:.4f}")


if __name__ == "__main__":
    main()
