"""Measure a step-cost table (the format :class:`vllm_rl.cost.TableCost` reads) with PyTorch.

    python -m vllm_rl.cost.measure OUT.json --shape qwen3-8b [--shape qwen3-1.7b]
        [--config path/to/config.json [--name NAME]] [--grid default|quick|tiny]
        [--batches 1,4,16] [--widths 1,2,9] [--contexts 256,1024]
        [--device cuda|cpu] [--max-kv-tokens 272000]

One engine step = B sequences, each with q new query tokens against L cached tokens.
The forward is a Qwen3-shaped decoder doing the model's real work, no vLLM: distinct
random weights per layer, a per-layer KV cache of L + q tokens (the step's keys are
written at L..L+q-1), RMSNorm, fused QKV projection, attention of the q queries over all
L + q keys (PyTorch SDPA; the query heads sharing a KV head are folded into the query
axis so the flash / memory-efficient kernels serve GQA without repeating the KV), O
projection, residual, RMSNorm, gated SiLU MLP, final norm, LM head and an argmax for
every query token.  Not modelled: the embedding lookup, RoPE and Qwen3's QK-norm
(element-wise, small), sampling and the host-side scheduling.

On CUDA each configuration is captured in a CUDA graph (as vLLM runs decode) and its
replays are timed with CUDA events: the median over ``rounds`` of the mean of ``reps``
replays.  On the CPU (for tests) the forward runs eagerly and is timed with
``time.perf_counter``.  Grid points whose KV cache B·(L + q_max) would exceed
``--max-kv-tokens`` are skipped (at the default 272k, the 8B cache is ~40 GB), so every
measured (B, L) has every q.  The output has the shared table's format: ``rows`` of
``{shape, B, q, L, ms}`` plus ``device``, ``torch``, ``dtype``, ``grid`` and ``shapes``.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from vllm_rl.cost.shapes import SHAPES, Shape


#: Grids (batches B, widths q, contexts L).  ``default`` is the shared H100 table's.
GRIDS = {
    "default": ((1, 4, 16, 32, 64, 128, 256, 512, 1024), (1, 2, 3, 5, 9),
                (256, 512, 1024, 4096, 8192)),
    "quick": ((1, 16, 64, 256), (1, 3, 9), (256, 1024, 4096)),
    "tiny": ((1, 2), (1, 2), (16, 32)),
}
MAX_KV_TOKENS = 272_000


# ------------------------------------------------------------------------------ model


class Decoder:
    """A Qwen3-shaped decoder forward over random weights (values do not change cost)."""

    def __init__(self, shape: Shape, device: torch.device, dtype: torch.dtype,
                 seed: int = 0) -> None:
        torch.manual_seed(seed)
        self.shape, self.device, self.dtype = shape, device, dtype
        s = shape

        def weight(rows: int, cols: int) -> torch.Tensor:
            return torch.empty(rows, cols, device=device, dtype=dtype).normal_(0.0, 0.02)

        def ones() -> torch.Tensor:
            return torch.ones(s.hidden, device=device, dtype=dtype)

        self.layers = [{
            "norm1": ones(), "norm2": ones(),
            "qkv": weight(s.hidden, (s.heads + 2 * s.kv_heads) * s.head_dim),
            "o": weight(s.heads * s.head_dim, s.hidden),
            "gate_up": weight(s.hidden, 2 * s.intermediate),
            "down": weight(s.intermediate, s.hidden),
        } for _ in range(s.layers)]
        self.norm = ones()
        self.lm_head = weight(s.hidden, s.vocab)

    def kv_cache(self, batch: int, tokens: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer (keys, values), each ``[batch, kv_heads, tokens, head_dim]``."""
        s = self.shape
        dims = (batch, s.kv_heads, tokens, s.head_dim)
        return [(torch.empty(dims, device=self.device, dtype=self.dtype).normal_(),
                 torch.empty(dims, device=self.device, dtype=self.dtype).normal_())
                for _ in range(s.layers)]

    def forward(self, x: torch.Tensor, cache: Sequence[tuple[torch.Tensor, torch.Tensor]],
                context: int) -> torch.Tensor:
        """One step: ``x`` ``[B, q, hidden]`` against ``context`` cached tokens; the token
        ids chosen (argmax), ``[B, q]``."""
        s = self.shape
        B, q, hidden = x.shape
        group = s.heads // s.kv_heads
        q_dim, kv_dim = s.heads * s.head_dim, s.kv_heads * s.head_dim
        for layer, (keys, values) in zip(self.layers, cache):
            h = F.rms_norm(x, (hidden,), layer["norm1"])
            query, key, value = (h @ layer["qkv"]).split([q_dim, kv_dim, kv_dim], dim=-1)
            new = slice(context, context + q)
            keys[:, :, new] = key.view(B, q, s.kv_heads, s.head_dim).transpose(1, 2)
            values[:, :, new] = value.view(B, q, s.kv_heads, s.head_dim).transpose(1, 2)
            # [B, q, kv, group, d] -> [B, kv, group * q, d]: GQA as a longer query axis.
            query = (query.view(B, q, s.kv_heads, group, s.head_dim)
                     .permute(0, 2, 3, 1, 4).reshape(B, s.kv_heads, group * q, s.head_dim))
            attn = F.scaled_dot_product_attention(
                query, keys[:, :, :context + q], values[:, :, :context + q])
            attn = (attn.view(B, s.kv_heads, group, q, s.head_dim)
                    .permute(0, 3, 1, 2, 4).reshape(B, q, q_dim))
            x = x + attn @ layer["o"]
            h = F.rms_norm(x, (hidden,), layer["norm2"])
            gate, up = (h @ layer["gate_up"]).chunk(2, dim=-1)
            x = x + (F.silu(gate) * up) @ layer["down"]
        logits = F.rms_norm(x, (hidden,), self.norm) @ self.lm_head
        return logits.argmax(dim=-1)


# ----------------------------------------------------------------------------- timing


def _sdpa_backends(device: torch.device):
    """On CUDA: the flash and memory-efficient SDPA kernels only (as a serving engine)."""
    from contextlib import nullcontext
    if device.type != "cuda":
        return nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION])


def time_step(model: Decoder, x: torch.Tensor, cache, context: int,
              rounds: int, reps: int) -> float:
    """Median over ``rounds`` of the mean time (ms) of ``reps`` steps."""
    device = model.device
    times = []
    with torch.inference_mode(), _sdpa_backends(device):
        if device.type != "cuda":
            model.forward(x, cache, context)                       # warm-up
            for _ in range(rounds):
                start = time.perf_counter()
                for _ in range(reps):
                    model.forward(x, cache, context)
                times.append((time.perf_counter() - start) * 1e3 / reps)
            return statistics.median(times)
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):                              # warm-up off the capture
            for _ in range(2):
                model.forward(x, cache, context)
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            model.forward(x, cache, context)
        for _ in range(3):
            graph.replay()
        for _ in range(rounds):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(reps):
                graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / reps)
        del graph
    return statistics.median(times)


def measure_shape(name: str, shape: Shape, batches: Sequence[int], widths: Sequence[int],
                  contexts: Sequence[int], device: torch.device, dtype: torch.dtype,
                  max_kv_tokens: int, rounds: int, reps: int) -> list[dict[str, Any]]:
    """The rows of one shape; one progress line per context length."""
    model = Decoder(shape, device, dtype)
    rows: list[dict[str, Any]] = []
    q_max = max(widths)
    for L in contexts:
        start = time.perf_counter()
        fits = [B for B in batches if B * (L + q_max) <= max_kv_tokens]
        for B in fits:
            cache = model.kv_cache(B, L + q_max)
            for q in widths:
                x = torch.empty(B, q, shape.hidden, device=device, dtype=dtype).normal_()
                ms = time_step(model, x, cache, L, rounds, reps)
                rows.append({"shape": name, "B": B, "q": q, "L": L, "ms": round(ms, 4)})
            del cache
            if device.type == "cuda":
                torch.cuda.empty_cache()
        skipped = len(batches) - len(fits)
        last = [r for r in rows if r["L"] == L]
        tail = (f"B={last[-1]['B']} q={last[-1]['q']}: {last[-1]['ms']} ms" if last else "")
        print(f"[measure] {name} L={L}: {len(fits)} batch sizes x {len(widths)} widths"
              f"{f' ({skipped} over the KV cap)' if skipped else ''} in "
              f"{time.perf_counter() - start:.1f} s; {tail}", flush=True)
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return rows


# -------------------------------------------------------------------------------- CLI


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated ints, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive ints, got {text!r}")
    return tuple(sorted(set(values)))


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m vllm_rl.cost.measure",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path, help="output JSON (TableCost's format)")
    p.add_argument("--shape", action="append", choices=sorted(SHAPES), default=[],
                   help="built-in shape (repeatable)")
    p.add_argument("--config", action="append", type=Path, default=[],
                   help="a Hugging Face config.json (repeatable)")
    p.add_argument("--name", help="the shape name of a single --config "
                                  "(default: its folder's name, or the file's stem)")
    p.add_argument("--grid", choices=sorted(GRIDS), default="default")
    p.add_argument("--batches", type=_ints, help="override the grid's B values, e.g. 1,4,16")
    p.add_argument("--widths", type=_ints, help="override the grid's q values, e.g. 1,2,9")
    p.add_argument("--contexts", type=_ints, help="override the grid's L values, e.g. 256,1024")
    p.add_argument("--device", default=None, help="cuda (default when available) or cpu")
    p.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default=None,
                   help="default: bfloat16 on CUDA, float32 on the CPU")
    p.add_argument("--max-kv-tokens", type=int, default=MAX_KV_TOKENS,
                   help="skip (B, L) whose KV cache B*(L + max q) exceeds this")
    p.add_argument("--rounds", type=int, default=None, help="default 5 (CUDA), 3 (CPU)")
    p.add_argument("--reps", type=int, default=None, help="default 10 (CUDA), 2 (CPU)")
    args = p.parse_args(argv)
    if not args.shape and not args.config:
        p.error("give at least one --shape or --config")
    if args.name and len(args.config) != 1:
        p.error("--name needs exactly one --config")
    return args


def _config_name(path: Path, name: str | None) -> str:
    if name:
        return name
    return path.resolve().parent.name if path.name == "config.json" else path.stem


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device available")
    cuda = device.type == "cuda"
    dtype = getattr(torch, args.dtype or ("bfloat16" if cuda else "float32"))
    rounds = args.rounds or (5 if cuda else 3)
    reps = args.reps or (10 if cuda else 2)
    batches, widths, contexts = GRIDS[args.grid]
    batches, widths, contexts = (args.batches or batches, args.widths or widths,
                                 args.contexts or contexts)
    shapes = {name: SHAPES[name] for name in args.shape}
    for path in args.config:
        shapes[_config_name(path, args.name)] = Shape.from_hf_config(path)
    torch.manual_seed(0)
    table: dict[str, Any] = {
        "device": torch.cuda.get_device_name(device) if cuda else "cpu",
        "torch": torch.__version__,
        "dtype": str(dtype).removeprefix("torch."),
        "grid": {"B": list(batches), "q": list(widths), "L": list(contexts),
                 "max_kv_tokens": args.max_kv_tokens, "rounds": rounds, "reps": reps},
        "shapes": {name: asdict(shape) for name, shape in shapes.items()},
        "rows": [],
    }
    for name, shape in shapes.items():
        table["rows"] += measure_shape(name, shape, batches, widths, contexts, device, dtype,
                                       args.max_kv_tokens, rounds, reps)
        _write(args.out, table)                                    # keep what is done
    _write(args.out, table)
    print(f"[measure] {len(table['rows'])} rows -> {args.out}", flush=True)
    return table


def _write(path: Path, table: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(table, indent=1) + "\n")
    tmp.replace(path)


if __name__ == "__main__":
    main(sys.argv[1:])
