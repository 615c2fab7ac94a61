"""ARRoL's quality head over the scored rows of a step (paper Sec. 4.2: "a 2-layer MLP
with hidden dimension 128"; the sigmoid maps its logit to a score in [0, 1], App. A.4):
``s_i = sigmoid(w2 · act(W1 h_i + b1) + b2)`` for ``h_i = hidden[rows[i]]``.

- :func:`triton_score_rows`: one Triton program per scored row gathers the row by index
  (no gathered copy in torch), computes layer 1 in tiles of ``BLOCK_H`` hidden units for
  all ``D`` head units at once (``BLOCK_D`` = next power of two ≥ D, D ≤ 256), adds the
  bias, applies the activation, takes layer 2's dot product, adds its bias and applies
  the sigmoid, all in float32 whatever the hidden dtype;
- :func:`torch_score_rows`: the same in PyTorch (the CPU path, and the reference);
- :func:`score_rows`: Triton for CUDA tensors when Triton is importable, else PyTorch;
  ``backend=`` or the ``VLLM_RL_HEAD_BACKEND`` env var (``auto`` | ``torch`` |
  ``triton``) forces one (the keyword wins over the env var).

Weights as :class:`vllm_rl.arrol.head.QualityHead` holds them: ``w1 = fc1.weight``
[D, H], ``b1 = fc1.bias`` [D], ``w2 = fc2.weight[0]`` [D], ``b2 = fc2.bias[0]`` (a 0-d
tensor or a float). Triton is imported only when the Triton path runs, so this module
imports (and its PyTorch path runs) where Triton is missing. It imports nothing from
vllm_rl, so it can be loaded by path (``benchmarks/arrol_kernel.py``).
"""
from __future__ import annotations

import os

import torch

ACTIVATIONS = ("relu", "gelu")
BACKENDS = ("auto", "torch", "triton")
MAX_D = 256
BACKEND_ENV = "VLLM_RL_HEAD_BACKEND"
_KERNEL = None


def _check(hidden, rows, w1, b1, w2, activation: str) -> None:
    """Shapes, dtypes and activation (no device synchronisation: row values unchecked)."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"score_rows activation={activation!r}: allowed {ACTIVATIONS}")
    if hidden.dim() != 2:
        raise ValueError(f"score_rows hidden: expected [N, H], got {tuple(hidden.shape)}")
    if rows.dim() != 1 or rows.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"score_rows rows: expected a 1-d int32/int64 tensor, got "
                         f"{rows.dtype} {tuple(rows.shape)}")
    D, H = (w1.shape if w1.dim() == 2 else (None, None))
    if H != hidden.shape[1]:
        raise ValueError(f"score_rows w1: expected [D, {hidden.shape[1]}], "
                         f"got {tuple(w1.shape)}")
    if tuple(b1.shape) not in ((D,), (rows.shape[0], D)) or tuple(w2.shape) != (D,):
        raise ValueError(f"score_rows b1/w2: expected b1 [{D}] or [{rows.shape[0]}, {D}] "
                         f"(per row) and w2 [{D}], got {tuple(b1.shape)} and "
                         f"{tuple(w2.shape)}")


def torch_score_rows(hidden, rows, w1, b1, w2, b2, activation: str = "relu"):
    """PyTorch path of the ARRoL quality head (Sec. 4.2), the CPU's and the reference.

    ``hidden`` [N, H] (fp32 / bf16 / fp16), ``rows`` [R] int32/int64 indices into it
    (duplicates and any order allowed; out-of-range indices raise), head weights as in the
    module docstring. Returns float32 [R]: ``sigmoid(w2 · act(w1 @ hidden[rows].T + b1)
    + b2)`` computed in float32; ``activation`` "relu" or "gelu" (exact erf GELU).
    """
    _check(hidden, rows, w1, b1, w2, activation)
    x = hidden.index_select(0, rows.to(hidden.device, torch.int64)).float()
    h = x @ w1.float().t() + b1.to(x.device).float()          # b1: [D], or [R, D] per row
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
    def head_kernel(hidden_ptr, stride_row, rows_ptr, w1_ptr, b1_ptr, b1_stride, w2_ptr,
                    b2_ptr, out_ptr, N, H, D, GELU: tl.constexpr, BLOCK_H: tl.constexpr,
                    BLOCK_D: tl.constexpr):
        # One scored row per program (Sec. 4.2 head): layer 1 over H in BLOCK_H tiles for
        # all D head units, fp32 accumulation; an out-of-range row reads nothing, gives NaN.
        pid = tl.program_id(0)
        row = tl.load(rows_ptr + pid).to(tl.int64)
        row_ok = (row >= 0) & (row < N)
        h_lim = tl.where(row_ok, H, 0)  # x's mask k < h_lim: all off for a bad row
        d = tl.arange(0, BLOCK_D)
        d_ok = d < D
        acc = tl.zeros((BLOCK_D,), dtype=tl.float32)
        for start in range(0, H, BLOCK_H):
            k = start + tl.arange(0, BLOCK_H)
            k_ok = k < H
            x = tl.load(hidden_ptr + row * stride_row + k, mask=k < h_lim,
                        other=0.0).to(tl.float32)
            w = tl.load(w1_ptr + d[:, None] * H + k[None, :],
                        mask=d_ok[:, None] & k_ok[None, :], other=0.0).to(tl.float32)
            acc += tl.sum(w * x[None, :], axis=1)
        # b1 per scored row (b1_stride = D: the trace features' part, W1f f, folded in)
        # or shared (b1_stride = 0)
        acc += tl.load(b1_ptr + pid * b1_stride + d, mask=d_ok, other=0.0).to(tl.float32)
        if GELU:
            acc = 0.5 * acc * (1.0 + tl.math.erf(acc * 0.7071067811865476))
        else:
            acc = tl.maximum(acc, 0.0)
        w2 = tl.load(w2_ptr + d, mask=d_ok, other=0.0).to(tl.float32)
        z = tl.sum(acc * w2, axis=0) + tl.load(b2_ptr).to(tl.float32)
        s = 1.0 / (1.0 + tl.exp(-z))
        tl.store(out_ptr + pid, tl.where(row_ok, s, float("nan")))

    _KERNEL = (head_kernel, triton)
    return _KERNEL


def triton_score_rows(hidden, rows, w1, b1, w2, b2, activation: str = "relu",
                      block_h: int = 128, num_warps: int = 4):
    """Triton path of the ARRoL quality head (Sec. 4.2): same contract as
    :func:`torch_score_rows`, one program per row of ``rows``.

    The row is gathered by index inside the kernel (``hidden`` may have any row stride;
    a non-unit column stride costs one ``contiguous()`` copy). ``D`` ≤ 256 (padded to
    ``BLOCK_D`` = next power of two); ``block_h`` (a power of two) is the layer-1 tile
    over H. All math is float32. An out-of-range row index is never read: its score is
    NaN (the PyTorch path raises instead). Needs CUDA tensors, or CPU tensors under
    ``TRITON_INTERPRET=1``.
    """
    _check(hidden, rows, w1, b1, w2, activation)
    D, H = w1.shape
    if D > MAX_D:
        raise ValueError(f"triton_score_rows: head width {D} > {MAX_D}")
    kernel, triton = _kernel()
    n = int(rows.numel())
    out = torch.empty(n, dtype=torch.float32, device=hidden.device)
    if n == 0:
        return out
    if hidden.stride(1) != 1:
        hidden = hidden.contiguous()
    dev = hidden.device
    b2 = torch.as_tensor(b2, dtype=torch.float32, device=dev).reshape(1)
    b1 = b1.to(dev).float().contiguous()
    kernel[(n,)](hidden, hidden.stride(0), rows.to(dev).contiguous(), w1.to(dev).contiguous(),
                 b1, D if b1.dim() == 2 else 0, w2.to(dev).contiguous(), b2, out,
                 hidden.shape[0], H, D, GELU=activation == "gelu", BLOCK_H=block_h,
                 BLOCK_D=triton.next_power_of_2(D), num_warps=num_warps)
    return out


def _triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def score_rows(hidden, rows, w1, b1, w2, b2, activation: str = "relu",
               backend: str | None = None):
    """ARRoL quality-head scores (Sec. 4.2) of ``hidden[rows]``: float32 [len(rows)] in
    [0, 1], ``sigmoid(w2 · act(w1 @ hidden[rows].T + b1) + b2)``.

    ``backend``: ``"auto"`` (default; Triton when ``hidden.is_cuda`` and Triton imports,
    else PyTorch), ``"torch"`` or ``"triton"``; when None, the ``VLLM_RL_HEAD_BACKEND``
    env var, else ``"auto"``.
    """
    backend = backend or os.environ.get(BACKEND_ENV) or "auto"
    if backend not in BACKENDS:
        raise ValueError(f"score_rows backend={backend!r}: allowed {BACKENDS}")
    if backend == "auto":
        backend = "triton" if hidden.is_cuda and _triton_available() else "torch"
    if backend == "triton":
        return triton_score_rows(hidden, rows, w1, b1, w2, b2, activation)
    return torch_score_rows(hidden, rows, w1, b1, w2, b2, activation)
