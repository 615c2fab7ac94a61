"""The ARRoL quality-head kernel (paper Sec. 4.2): Triton under Triton's interpreter (CPU
tensors) against the PyTorch path, and the PyTorch path against hand-written references.

``TRITON_INTERPRET=1`` must be set before Triton is imported, so the Triton comparison runs
in one subprocess (``CHECK``) that loads ``kernels/arrol_head.py`` by path.
Tolerance: 1e-5 absolute on scores in [0, 1] for fp32, bf16 and fp16 hidden states alike:
both paths read the same (rounded) values and compute in fp32, so only the summation order
differs. This suite never runs the kernel on CUDA; ``benchmarks/arrol_kernel.py`` checks
and times it there.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
HEAD_PY = ROOT / "kernels" / "arrol_head.py"
TOL = 1e-5

CHECK = r"""
import importlib.util, json, math, os, sys
import torch
spec = importlib.util.spec_from_file_location("arrol_head", sys.argv[1])
m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
assert os.environ["TRITON_INTERPRET"] == "1"
torch.manual_seed(0)
worst, cases = {}, 0

def cmp(tag, hid, rows, w1, b1, w2, b2, act, **kw):
    global cases
    a = m.triton_score_rows(hid, rows, w1, b1, w2, b2, act, **kw)
    b = m.torch_score_rows(hid, rows, w1, b1, w2, b2, act)
    assert a.shape == b.shape == (rows.numel(),), (tag, a.shape, b.shape)
    assert a.dtype == b.dtype == torch.float32, tag
    assert bool(((a >= 0) & (a <= 1)).all()), tag
    d = (a - b).abs().max().item() if rows.numel() else 0.0
    worst[tag] = max(worst.get(tag, 0.0), d); cases += 1

N = 40
for H in (64, 200):                                   # 200: not a multiple of BLOCK_H
    w1, b1 = torch.randn(128, H) * 0.15, torch.randn(128) * 0.1
    w2, b2 = torch.randn(128) * 0.3, torch.tensor(0.3)
    base = torch.randn(N, H) * 2
    for dt in (torch.float32, torch.bfloat16):
        hid = base.to(dt)
        for act in ("relu", "gelu"):
            for R in (0, 1, 7, 33):
                rows = torch.randint(0, N, (R,))      # R = 33 > 0: duplicates, any order
                cmp(str(dt).split(".")[1], hid, rows, w1, b1, w2, b2, act)
    fixed = torch.tensor([39, 3, 3, 0, 17, 3, 39, 1])    # duplicates, out of order, ends
    cmp("int32", base, fixed.to(torch.int32), w1, b1, w2, b2, "gelu")
    cmp("float16", base.half(), fixed, w1, b1, w2, b2, "relu")
    wide = torch.randn(N, H + 24)                    # row stride H + 24: in-kernel gather
    cmp("strided", wide[:, 5:5 + H], fixed, w1, b1, w2, b2, "gelu")
    cmp("bf16_weights", base.bfloat16(), fixed, w1.bfloat16(), b1.bfloat16(),
        w2.bfloat16(), 0.3, "relu")
    for bh in (32, 256):
        cmp(f"block_h_{bh}", base, fixed, w1, b1, w2, b2, "gelu", block_h=bh)
    for D in (100, 256, 1):                           # BLOCK_D padding, and the maximum
        w1d, b1d, w2d = torch.randn(D, H) * 0.15, torch.randn(D) * 0.1, torch.randn(D) * 0.3
        cmp(f"D_{D}", base, fixed, w1d, b1d, w2d, -0.2, "gelu")

# an out-of-range row is never read by the kernel: NaN there, the others unchanged
s = m.triton_score_rows(base, torch.tensor([2, N, 5, -1]), w1, b1, w2, b2, "relu")
ref = m.torch_score_rows(base, torch.tensor([2, 5]), w1, b1, w2, b2, "relu")
assert math.isnan(s[1].item()) and math.isnan(s[3].item()), s
assert (s[[0, 2]] - ref).abs().max().item() < 1e-5, (s, ref)
try:
    m.triton_score_rows(base, fixed, torch.randn(257, H), torch.randn(257), torch.randn(257), 0.0)
    raise SystemExit("D = 257 accepted")
except ValueError:
    pass

# dispatch: backend= and the env var pick the Triton path for CPU tensors
calls = []
real = m.triton_score_rows
m.triton_score_rows = lambda *a, **k: calls.append(1) or real(*a, **k)
m.score_rows(base, fixed, w1, b1, w2, b2, backend="triton")
os.environ[m.BACKEND_ENV] = "triton"; m.score_rows(base, fixed, w1, b1, w2, b2)
m.score_rows(base, fixed, w1, b1, w2, b2, backend="torch")       # the keyword wins
os.environ[m.BACKEND_ENV] = "auto"; m.score_rows(base, fixed, w1, b1, w2, b2)  # CPU: torch
assert len(calls) == 2, calls
print(json.dumps({"worst": worst, "cases": cases}))
"""


def test_triton_kernel_matches_pytorch_under_the_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    env.pop("VLLM_RL_HEAD_BACKEND", None)
    res = subprocess.run([sys.executable, "-c", CHECK, str(HEAD_PY)], env=env,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["cases"] == 2 * (2 * 2 * 4 + 9), out
    assert max(out["worst"].values()) < TOL, out
    print(out)


def _reference(hidden_size: int, width: int, activation: str) -> torch.nn.Sequential:
    act = torch.nn.ReLU() if activation == "relu" else torch.nn.GELU()
    return torch.nn.Sequential(torch.nn.Linear(hidden_size, width), act,
                               torch.nn.Linear(width, 1), torch.nn.Sigmoid())


def _weights(seq: torch.nn.Sequential):
    fc1, fc2 = seq[0], seq[2]
    return (fc1.weight.detach(), fc1.bias.detach(), fc2.weight.detach()[0],
            fc2.bias.detach()[0])


@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_torch_path_is_the_sequential_mlp(activation, dtype, monkeypatch):
    from vllm_rl.kernels import score_rows

    monkeypatch.delenv("VLLM_RL_HEAD_BACKEND", raising=False)
    torch.manual_seed(1)
    seq = _reference(48, 128, activation)
    hidden = torch.randn(10, 48).to(dtype)
    for rows in (torch.tensor([9, 0, 4, 4, 2]), torch.tensor([7], dtype=torch.int32),
                 torch.tensor([], dtype=torch.int64)):
        got = score_rows(hidden, rows, *_weights(seq), activation)
        want = seq(hidden.float()[rows.long()]).squeeze(-1).detach()
        assert got.dtype == torch.float32 and got.shape == rows.shape
        torch.testing.assert_close(got, want, atol=1e-6, rtol=0)


def test_torch_path_is_the_quality_head():
    from vllm_rl.arrol.head import QualityHead
    from vllm_rl.kernels import score_rows

    torch.manual_seed(2)
    for act in ("relu", "gelu"):
        head = QualityHead(48, activation=act)
        hidden = torch.randn(10, 48)
        rows = torch.tensor([9, 0, 4, 4])
        got = score_rows(hidden, rows, head.fc1.weight.detach(), head.fc1.bias.detach(),
                         head.fc2.weight.detach()[0], head.fc2.bias.detach()[0], act,
                         backend="torch")
        torch.testing.assert_close(got, head.score(hidden[rows]), atol=1e-6, rtol=0)


def test_arguments_are_checked():
    from vllm_rl.kernels import score_rows

    hidden, rows = torch.randn(4, 8), torch.tensor([0, 1])
    w1, b1, w2 = torch.randn(16, 8), torch.randn(16), torch.randn(16)
    for kw, msg in (({"backend": "cuda-graphs"}, "backend"), ({"activation": "tanh"}, "activation")):
        with pytest.raises(ValueError, match=msg):
            score_rows(hidden, rows, w1, b1, w2, 0.0, **kw)
    for args, msg in (((hidden[0], rows, w1, b1, w2), "hidden"),
                      ((hidden, rows.float(), w1, b1, w2), "rows"),
                      ((hidden, rows, w1.T, b1, w2), "w1"),
                      ((hidden, rows, w1, b1[:3], w2), "b1/w2")):
        with pytest.raises(ValueError, match=msg):
            score_rows(*args, 0.0)
    with pytest.raises(IndexError):
        score_rows(hidden, torch.tensor([4]), w1, b1, w2, 0.0, backend="torch")


def test_module_imports_and_scores_without_triton(monkeypatch):
    monkeypatch.setitem(sys.modules, "triton", None)     # `import triton` -> ImportError
    monkeypatch.delenv("VLLM_RL_HEAD_BACKEND", raising=False)
    spec = importlib.util.spec_from_file_location("arrol_head_no_triton", HEAD_PY)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    assert not m._triton_available()
    hidden, rows = torch.randn(5, 8), torch.tensor([4, 0])
    w1, b1, w2 = torch.randn(16, 8), torch.randn(16), torch.randn(16)
    assert m.score_rows(hidden, rows, w1, b1, w2, 0.0).shape == (2,)
    with pytest.raises(ImportError):
        m.score_rows(hidden, rows, w1, b1, w2, 0.0, backend="triton")
