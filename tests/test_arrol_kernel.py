"""The ARRoL head kernel: Triton (under Triton's interpreter, on the CPU) against PyTorch.

``TRITON_INTERPRET=1`` must be set before Triton is imported, so the comparison runs in
a subprocess.  Tolerance: 1e-5 absolute on scores in [0, 1], for fp32 and bf16 hidden
states alike (both paths compute in fp32 after loading).  On CUDA the kernel was not
run by this suite (no GPU here); ``benchmarks/arrol_kernel.py`` times and checks it
there.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
TOL = 1e-5

SCRIPT = r"""
import importlib.util, json, sys
import torch
spec = importlib.util.spec_from_file_location("arrol_head", sys.argv[1])
m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
torch.manual_seed(0)
worst, cases = 0.0, 0
for H in (64, 200):                      # 200: not a multiple of BLOCK_H
    for act in ("relu", "gelu"):
        for dt in (torch.float32, torch.bfloat16):
            hid = (torch.randn(40, H) * 2).to(dt)
            w1, b1 = torch.randn(128, H) * 0.1, torch.randn(128) * 0.1
            w2, b2 = torch.randn(128) * 0.3, torch.tensor(0.3)
            for R in (0, 1, 7, 33):
                rows = torch.randint(0, 40, (R,))          # duplicates, any order
                a = m.triton_score_rows(hid, rows, w1, b1, w2, b2, act)
                b = m.torch_score_rows(hid, rows, w1, b1, w2, b2, act)
                assert a.shape == b.shape == (R,) and a.dtype == torch.float32
                worst = max(worst, (a - b).abs().max().item() if R else 0.0)
                cases += 1
    w1, b1, w2 = torch.randn(100, H) * 0.1, torch.randn(100) * 0.1, torch.randn(100)  # D=100
    rows = torch.tensor([3, 3, 0, 39])
    a = m.triton_score_rows(hid.float(), rows, w1, b1, w2, 0.0, "relu")
    b = m.torch_score_rows(hid.float(), rows, w1, b1, w2, 0.0, "relu")
    worst = max(worst, (a - b).abs().max().item()); cases += 1
print(json.dumps({"worst": worst, "cases": cases}))
"""


def test_triton_kernel_matches_pytorch_under_the_interpreter():
    import json

    env = {**os.environ, "TRITON_INTERPRET": "1"}
    res = subprocess.run([sys.executable, "-c", SCRIPT, str(ROOT / "kernels" / "arrol_head.py")],
                         env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["cases"] == 34 and out["worst"] < TOL, out


def test_torch_path_is_the_quality_head():
    from vllm_rl.control.arrol import QualityHead
    from vllm_rl.kernels import score_rows

    torch.manual_seed(1)
    for act in ("relu", "gelu"):
        head = QualityHead(48, activation=act)
        hidden = torch.randn(10, 48)
        rows = torch.tensor([9, 0, 4, 4])
        got = score_rows(hidden, rows, head.fc1.weight.detach(), head.fc1.bias.detach(),
                         head.fc2.weight.detach()[0], head.fc2.bias.detach()[0], act)
        assert torch.allclose(got, head.score(hidden[rows]), atol=1e-6)
    import pytest

    with pytest.raises(ValueError, match="backend"):
        score_rows(hidden, rows, head.fc1.weight, head.fc1.bias, head.fc2.weight[0], 0.0,
                   backend="cuda-graphs")
