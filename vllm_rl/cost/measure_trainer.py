"""Measure the trainer's passes at a model shape with PyTorch, for
:meth:`vllm_rl.cost.trainer.TrainerCost.load`.

    python -m vllm_rl.cost.measure_trainer OUT.json --shape qwen3-1.7b
        [--rows 64] [--length 512] [--device cuda|cpu] [--dtype bfloat16]

A Qwen3-shaped decoder (:class:`~vllm_rl.cost.shapes.Shape`: RMSNorm, fused QKV,
causal SDPA with grouped KV heads, gated SiLU MLP, LM head; no RoPE or QK-norm, which are
element-wise) over random weights, ``rows`` sequences of ``length`` tokens:

* ``forward_s_per_token``: a no-grad forward (the log-prob pass) over the batch, per token;
* ``train_s_per_token``: a forward and backward with gradient checkpointing per layer
  (TRL's GRPO default), per token;
* ``optimizer_s``: one AdamW step over the model's parameters (fp32 master weights).

Times are the median of ``rounds`` after a warm-up (CUDA events on a GPU,
``perf_counter`` on the CPU).  The whole model is trained on one device, so a shape
that does not fit (the 8B shape's optimizer state on one 80 GB GPU) is measured with
``--layers`` layers and without, and extrapolated to the full depth (the row records it).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from vllm_rl.cost.shapes import SHAPES, Shape


class Layer(torch.nn.Module):
    def __init__(self, s: Shape) -> None:
        super().__init__()
        self.s = s
        self.norm1 = torch.nn.Parameter(torch.ones(s.hidden))
        self.norm2 = torch.nn.Parameter(torch.ones(s.hidden))
        self.qkv = torch.nn.Linear(s.hidden, (s.heads + 2 * s.kv_heads) * s.head_dim, bias=False)
        self.o = torch.nn.Linear(s.heads * s.head_dim, s.hidden, bias=False)
        self.gate_up = torch.nn.Linear(s.hidden, 2 * s.intermediate, bias=False)
        self.down = torch.nn.Linear(s.intermediate, s.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = self.s
        B, T, hidden = x.shape
        h = F.rms_norm(x, (hidden,), self.norm1)
        q, k, v = self.qkv(h).split([s.heads * s.head_dim, s.kv_heads * s.head_dim,
                                     s.kv_heads * s.head_dim], dim=-1)
        q = q.view(B, T, s.heads, s.head_dim).transpose(1, 2)
        k = k.view(B, T, s.kv_heads, s.head_dim).transpose(1, 2)
        v = v.view(B, T, s.kv_heads, s.head_dim).transpose(1, 2)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                              enable_gqa=s.heads != s.kv_heads)
        x = x + self.o(attn.transpose(1, 2).reshape(B, T, s.heads * s.head_dim))
        gate, up = self.gate_up(F.rms_norm(x, (hidden,), self.norm2)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


class Model(torch.nn.Module):
    """The decoder; ``forward`` returns the mean log-prob of the next tokens (a loss)."""

    def __init__(self, s: Shape, layers: int) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(s.vocab, s.hidden)
        self.layers = torch.nn.ModuleList(Layer(s) for _ in range(layers))
        self.norm = torch.nn.Parameter(torch.ones(s.hidden))
        self.head = torch.nn.Linear(s.hidden, s.vocab, bias=False)
        if s.tied:
            self.head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor, recompute: bool) -> torch.Tensor:
        x = self.embed(ids)
        for layer in self.layers:
            x = checkpoint(layer, x, use_reentrant=False) if recompute else layer(x)
        logits = self.head(F.rms_norm(x, (x.shape[-1],), self.norm)).float()
        logp = torch.log_softmax(logits[:, :-1], dim=-1)
        return logp.gather(-1, ids[:, 1:, None]).mean()


def _time(fn, device: torch.device, rounds: int) -> float:
    fn()                                                              # warm-up
    times = []
    for _ in range(rounds):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _passes(shape: Shape, depth: int, rows: int, length: int, device: torch.device,
            dtype: torch.dtype, rounds: int) -> tuple[float, float, float]:
    """(forward, train, optimizer) seconds of a ``depth``-layer model over the batch."""
    torch.manual_seed(0)
    model = Model(shape, depth).to(device=device, dtype=dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=device.type == "cuda")
    ids = torch.randint(0, shape.vocab, (rows, length), device=device)

    def forward() -> None:
        with torch.no_grad():
            model(ids, recompute=False)

    def train() -> None:
        model(ids, recompute=True).backward()

    return _time(forward, device, rounds), _time(train, device, rounds), _time(opt.step, device,
                                                                               rounds)


def measure(name: str, shape: Shape, rows: int, length: int, device: torch.device,
            dtype: torch.dtype, rounds: int, layers: int | None = None) -> dict[str, Any]:
    """One shape's row: seconds per token of the log-prob pass and of training, and of one
    optimizer step, at the full depth.  With ``layers`` below the shape's depth, measured
    at 0 and ``layers`` layers and extrapolated linearly in the depth (the embedding and
    head once, the layers ``shape.layers`` times)."""
    depth = min(layers or shape.layers, shape.layers)
    full = _passes(shape, depth, rows, length, device, dtype, rounds)
    if device.type == "cuda":
        torch.cuda.empty_cache()
    if depth < shape.layers:
        base = _passes(shape, 0, rows, length, device, dtype, rounds)
        full = tuple(b + (f - b) * shape.layers / depth for b, f in zip(base, full))
    fwd, trn, step = (max(t, 0.0) for t in full)
    tokens = rows * length
    row = {"shape": name, "rows": rows, "length": length, "layers_measured": depth,
           "forward_s_per_token": fwd / tokens, "train_s_per_token": trn / tokens,
           "optimizer_s": step}
    print(f"[measure_trainer] {name}: forward {fwd:.3f} s, train {trn:.3f} s, optimizer "
          f"{step:.3f} s over {rows} x {length} tokens ({depth} of {shape.layers} layers "
          "measured)", flush=True)
    return row


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(prog="python -m vllm_rl.cost.measure_trainer",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path)
    p.add_argument("--shape", action="append", choices=sorted(SHAPES), default=[])
    p.add_argument("--rows", type=int, default=16)
    p.add_argument("--length", type=int, default=512)
    p.add_argument("--layers", type=int, default=None,
                   help="measure this many layers and scale to the shape's depth")
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", choices=["bfloat16", "float32"], default=None)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    if not args.shape:
        p.error("give at least one --shape")
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    doc = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
           "torch": torch.__version__, "dtype": str(dtype).removeprefix("torch."), "rows": []}
    for name in args.shape:
        doc["rows"].append(measure(name, SHAPES[name], args.rows, args.length, device, dtype,
                                   args.rounds, args.layers))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    return doc


if __name__ == "__main__":
    main(sys.argv[1:])
