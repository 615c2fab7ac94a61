"""Time and check ARRoL's Triton head kernel against PyTorch on a CUDA machine.

    python benchmarks/arrol_kernel.py          # needs only torch + triton (no vLLM)

Hidden sizes 2048 (Qwen3-1.7B) and 4096 (Qwen3-8B), bf16 hidden states, 1..1024 scored
rows gathered from a 4096-row step; prints max |difference| and the median time of each.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path


def main() -> None:
    import torch

    if not torch.cuda.is_available():
        print("CUDA is needed for this benchmark (the CPU path is PyTorch's); nothing to do")
        return
    path = Path(__file__).resolve().parents[1] / "kernels" / "arrol_head.py"
    spec = importlib.util.spec_from_file_location("arrol_head", path)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    torch.manual_seed(0)
    print(f"{'H':>5} {'rows':>5} {'max |diff|':>11} {'triton us':>10} {'torch us':>9}")
    for H in (2048, 4096):
        hidden = torch.randn(4096, H, device="cuda", dtype=torch.bfloat16)
        w1 = torch.randn(128, H, device="cuda") * 0.02
        b1, w2 = torch.randn(128, device="cuda") * 0.02, torch.randn(128, device="cuda") * 0.1
        b2 = torch.tensor(0.1, device="cuda")
        for r in (1, 8, 64, 256, 1024):
            rows = torch.randint(0, 4096, (r,), device="cuda")
            a = m.triton_score_rows(hidden, rows, w1, b1, w2, b2)
            b = m.torch_score_rows(hidden, rows, w1, b1, w2, b2)
            diff = (a - b).abs().max().item()
            times = []
            for fn in (m.triton_score_rows, m.torch_score_rows):
                for _ in range(5):
                    fn(hidden, rows, w1, b1, w2, b2)
                start, end = torch.cuda.Event(True), torch.cuda.Event(True)
                start.record()
                for _ in range(50):
                    fn(hidden, rows, w1, b1, w2, b2)
                end.record()
                torch.cuda.synchronize()
                times.append(start.elapsed_time(end) / 50 * 1e3)
            print(f"{H:>5} {r:>5} {diff:>11.2e} {times[0]:>10.1f} {times[1]:>9.1f}")


if __name__ == "__main__":
    sys.exit(main())
