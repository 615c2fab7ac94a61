"""ARRoL's quality head over the scored rows of a step (Sec. 4.2: 2-layer MLP, 128 hidden,
sigmoid): ``s = sigmoid(w2 · act(W1 h + b1) + b2)`` for ``h = hidden[rows[i]]``.

- :func:`triton_score_rows`: one Triton program per scored row gathers the row by index
  (no gathered copy), computes layer 1 in tiles of ``BLOCK_H`` hidden units for all
  ``D`` head units at once (``BLOCK_D`` = next power of two ≥ D), adds the bias, applies
  the activation, takes layer 2's dot product, adds its bias and applies the sigmoid,
  all in float32 whatever the hidden dtype;
- :func:`torch_score_rows`: the same in PyTorch (the CPU path, and the reference);
- :func:`score_rows`: Triton for CUDA tensors when Triton is importable, else PyTorch;
  ``backend=`` or ``VLLM_RL_HEAD_BACKEND`` (``auto`` | ``torch`` | ``triton``) forces one.

Weights as :class:`vllm_rl.control.arrol.QualityHead` holds them: ``w1 = fc1.weight``
[D, H], ``b1 = fc1.bias`` [D], ``w2 = fc2.weight[0]`` [D], ``b2 = fc2.bias[0]``.
Triton is imported only when the Triton path runs.
"""
from __future__ import annotations

import os

import torch

ACTIVATIONS = ("relu", "gelu")
_KERNEL = None


def torch_score_rows(hidden, rows, w1, b1, w2, b2, activation: str = "relu"):
    x = hidden.index_select(0, rows.to(torch.int64)).float()
    h = torch.nn.functional.linear(x, w1.float(), b1.float())
    h = torch.relu(h) if activation == "relu" else torch.nn.functional.gelu(h)
    return torch.sigmoid(h @ w2.float() + torch.as_tensor(b2, dtype=torch.float32,
                                                           device=h.device))


def _kernel():
    global _KERNEL
    if _KERNEL is not None:
        return _KERNEL
    import triton
    import triton.language as tl

    @triton.jit
    def head_kernel(hidden_ptr, stride_row, rows_ptr, w1_ptr, b1_ptr, w2_ptr, b2_ptr, out_ptr,
                    H, D, GELU: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
        pid = tl.program_id(0)
        row = tl.load(rows_ptr + pid).to(tl.int64)
        d = tl.arange(0, BLOCK_D)
        d_ok = d < D
        acc = tl.zeros((BLOCK_D,), dtype=tl.float32)
        for start in range(0, H, BLOCK_H):
            k = start + tl.arange(0, BLOCK_H)
            k_ok = k < H
            x = tl.load(hidden_ptr + row * stride_row + k, mask=k_ok, other=0.0).to(tl.float32)
            w = tl.load(w1_ptr + d[:, None] * H + k[None, :],
                        mask=d_ok[:, None] & k_ok[None, :], other=0.0).to(tl.float32)
            acc += tl.sum(w * x[None, :], axis=1)
        acc += tl.load(b1_ptr + d, mask=d_ok, other=0.0).to(tl.float32)
        if GELU:
            acc = 0.5 * acc * (1.0 + tl.math.erf(acc * 0.7071067811865476))
        else:
            acc = tl.maximum(acc, 0.0)
        w2 = tl.load(w2_ptr + d, mask=d_ok, other=0.0).to(tl.float32)
        z = tl.sum(acc * w2, axis=0) + tl.load(b2_ptr).to(tl.float32)
        tl.store(out_ptr + pid, 1.0 / (1.0 + tl.exp(-z)))

    _KERNEL = (head_kernel, triton)
    return _KERNEL


def triton_score_rows(hidden, rows, w1, b1, w2, b2, activation: str = "relu",
                      block_h: int = 128):
    kernel, triton = _kernel()
    n = int(rows.numel())
    out = torch.empty(n, dtype=torch.float32, device=hidden.device)
    if n == 0:
        return out
    if hidden.stride(-1) != 1:
        hidden = hidden.contiguous()
    D, H = w1.shape
    if D > 256:
        raise ValueError(f"triton_score_rows: head width {D} > 256")
    b2 = torch.as_tensor(b2, dtype=torch.float32, device=hidden.device).reshape(1)
    kernel[(n,)](hidden, hidden.stride(0), rows.contiguous(), w1.contiguous(),
                 b1.contiguous(), w2.contiguous(), b2, out, H, D,
                 GELU=activation == "gelu", BLOCK_H=block_h,
                 BLOCK_D=triton.next_power_of_2(D))
    return out


def _triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def score_rows(hidden, rows, w1, b1, w2, b2, activation: str = "relu",
               backend: str | None = None):
    """Scores in [0, 1] (float32, shape [len(rows)]) of ``hidden[rows]``."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"score_rows activation={activation!r}: allowed {ACTIVATIONS}")
    backend = backend or os.environ.get("VLLM_RL_HEAD_BACKEND", "auto")
    if backend == "auto":
        backend = "triton" if hidden.is_cuda and _triton_available() else "torch"
    if backend == "triton":
        return triton_score_rows(hidden, rows, w1, b1, w2, b2, activation)
    if backend != "torch":
        raise ValueError(f"score_rows backend={backend!r}: allowed 'auto', 'torch', 'triton'")
    return torch_score_rows(hidden, rows, w1, b1, w2, b2, activation)
