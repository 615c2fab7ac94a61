"""Check and time ARRoL's Triton quality-head kernel (paper Sec. 4.2) against PyTorch on CUDA.

    python benchmarks/arrol_kernel.py                   # needs only torch + triton (no vLLM)
    python benchmarks/arrol_kernel.py --block-h 32,64,128 --num-warps 4,8

Loads ``kernels/arrol_head.py`` by path, so vllm_rl's dependencies need not be installed.
Hidden sizes 2048 (Qwen3-1.7B) and 4096 (Qwen3-8B), bf16 hidden states of a 4096-row
step, head width 128, 1..1024 scored rows (random, duplicates allowed). For each case it
prints max |triton - torch| over relu and gelu, and the mean time per call (CUDA events
over ``--iters`` calls after a warm-up; launch overhead included, as in the engine's one
call per step). Exits 1 when any difference exceeds ``--tol``; on a machine without CUDA
it says so and exits 0.
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

HEAD_PY = Path(__file__).resolve().parents[1] / "kernels" / "arrol_head.py"


def load_head():
    spec = importlib.util.spec_from_file_location("arrol_head", HEAD_PY)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def time_us(torch, fn, iters: int) -> float:
    for _ in range(5):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters * 1e3


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", default="2048,4096", help="hidden sizes H")
    ap.add_argument("--rows", default="1,8,64,256,1024", help="scored-row counts R")
    ap.add_argument("--block-h", default="128", help="BLOCK_H values to time")
    ap.add_argument("--num-warps", default="4", help="num_warps values to time")
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--tol", type=float, default=1e-4)
    args = ap.parse_args(argv)
    ints = lambda s: [int(v) for v in s.split(",")]  # noqa: E731

    import torch

    if not torch.cuda.is_available():
        print("arrol_kernel: CUDA is needed for this benchmark (the CPU path is PyTorch's; "
              "tests/unit/test_arrol_kernel.py checks the kernel under Triton's interpreter)")
        return 0
    m = load_head()
    torch.manual_seed(0)
    dev = "cuda"
    configs = [(bh, nw) for bh in ints(args.block_h) for nw in ints(args.num_warps)]
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}")
    head = f"{'H':>5} {'rows':>5} {'max |diff|':>11} {'torch us':>9}"
    print(head + "".join(f" {f'triton bh{bh} w{nw}':>17}" for bh, nw in configs))
    worst = 0.0
    for H in ints(args.hidden):
        hidden = torch.randn(4096, H, device=dev).to(torch.bfloat16)
        w1 = torch.randn(128, H, device=dev) * H ** -0.5
        b1, w2 = torch.randn(128, device=dev) * 0.1, torch.randn(128, device=dev) * 0.3
        b2 = torch.tensor(0.1, device=dev)
        for r in ints(args.rows):
            rows = torch.randint(0, 4096, (r,), device=dev)
            diff = 0.0
            for act in ("relu", "gelu"):
                for bh, nw in configs:
                    a = m.triton_score_rows(hidden, rows, w1, b1, w2, b2, act,
                                            block_h=bh, num_warps=nw)
                    b = m.torch_score_rows(hidden, rows, w1, b1, w2, b2, act)
                    diff = max(diff, (a - b).abs().max().item())
                a = m.triton_score_rows(hidden, rows.int(), w1, b1, w2, b2, act)
                diff = max(diff, (a - b).abs().max().item())
            worst = max(worst, diff)
            t_torch = time_us(torch, lambda: m.torch_score_rows(hidden, rows, w1, b1, w2, b2),
                              args.iters)
            t_tri = [time_us(torch, lambda: m.triton_score_rows(
                hidden, rows, w1, b1, w2, b2, block_h=bh, num_warps=nw), args.iters)
                for bh, nw in configs]
            print(f"{H:>5} {r:>5} {diff:>11.2e} {t_torch:>9.1f}"
                  + "".join(f" {t:>17.1f}" for t in t_tri))
    ok = worst <= args.tol
    print(f"worst |triton - torch| = {worst:.2e} (tolerance {args.tol:g}): "
          f"{'ok' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
