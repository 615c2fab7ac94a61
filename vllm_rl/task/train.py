"""Train a kit's embedded policy on the CPU (seeded).

    python -m vllm_rl.task.train --out vllm_rl/task/model       # the first kit, ~30 min on 2 cores
    python -m vllm_rl.task.train --task reasoning                # warm-started from the first

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

from .kits import KITS, Kit, kit
from .problems import EOS
from .tokenizer import build_tokenizer


def model_config(vocab_size: int, max_positions: int = 1024):
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=vocab_size, hidden_size=256, intermediate_size=768,
        num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4,
        head_dim=64, max_position_embeddings=max_positions, rope_theta=10000.0,
        tie_word_embeddings=True, bos_token_id=0, eos_token_id=0, pad_token_id=0,
        torch_dtype="float32")


def make_example(tok, the_kit: Kit, problem, rng: random.Random) -> tuple[list[int], int]:
    """Token ids of prompt+completion and the index where the completion starts.  Teacher
    traces longer than the kit's ``completion_cap`` are cut with no EOS: the model learns
    to run on."""
    prompt_ids = tok.encode(problem.prompt).ids
    trace, _ = the_kit.teacher(problem, rng)
    comp_ids = tok.encode(" " + trace).ids
    if len(comp_ids) >= the_kit.completion_cap:
        comp_ids = comp_ids[:the_kit.completion_cap]
    else:
        comp_ids = comp_ids + [tok.token_to_id(EOS)]
    return prompt_ids + comp_ids, len(prompt_ids)


def batches(tok, the_kit: Kit, problems, rng, pool: int, token_budget: int):
    """Endless length-bucketed batches of fresh teacher traces."""
    import torch

    while True:
        ex = [make_example(tok, the_kit, rng.choice(problems), rng) for _ in range(pool)]
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
    ap.add_argument("--task", choices=list(KITS), default="arith", help="the kit to train")
    ap.add_argument("--out", type=Path, default=None, help="default: the kit's model folder")
    ap.add_argument("--init", type=Path, default=None,
                    help="warm-start from this model (the reasoning kit's default: the first kit's)")
    ap.add_argument("--steps", type=int, default=None, help="default: 1800, or 600 warm-started")
    ap.add_argument("--minutes", type=float, default=120.0, help="stop early after this long (a safety cap)")
    ap.add_argument("--lr", type=float, default=None, help="default: 2e-3, or 1e-3 warm-started")
    ap.add_argument("--token-budget", type=int, default=None, help="default: 8192, or 4096 warm-started")
    ap.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=None,
                    help="bf16 autocast (default: on for the first kit, as it was trained; off "
                         "warm-started: 8x slower than float32 on CPUs without AMX)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    import torch
    from tokenizers import Tokenizer
    from transformers import Qwen3ForCausalLM

    the_kit = kit(args.task)
    args.out = args.out or the_kit.model_path
    init = args.init or (KITS["arith"].model_path if args.task == "reasoning" else None)
    args.steps = args.steps or (600 if init else 1800)
    args.lr = args.lr or (1e-3 if init else 2e-3)
    args.token_budget = args.token_budget or (4096 if init else 8192)
    args.bf16 = (init is None) if args.bf16 is None else args.bf16
    max_positions = max(1024, 1 << (the_kit.max_model_len - 1).bit_length())
    torch.manual_seed(args.seed)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", 0)) or os.cpu_count() or 1)
    rng = random.Random(args.seed)
    build_tokenizer(args.out)
    tok = Tokenizer.from_file(str(args.out / "tokenizer.json"))
    vocab_size = tok.get_vocab_size()
    if init:
        model = Qwen3ForCausalLM.from_pretrained(init, torch_dtype=torch.float32)
        model.config.max_position_embeddings = max_positions
        print(f"warm start from {init}")
    else:
        model = Qwen3ForCausalLM(model_config(vocab_size, max_positions))
    print(f"params: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M, vocab {vocab_size}")
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01, betas=(0.9, 0.98))
    warm = 30 if init else 100

    def lr_at(step: int) -> float:
        if step < warm:
            return args.lr * (step + 1) / warm
        frac = min(1.0, (step - warm) / max(1, args.steps - warm))
        return args.lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * frac)))

    data = batches(tok, the_kit, the_kit.train_problems(), rng, pool=2048,
                   token_budget=args.token_budget)
    t0, ema = time.time(), None
    model.train()
    for step in range(args.steps):
        ids, labels, attn = next(data)
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
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
