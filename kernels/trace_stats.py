"""ARRoL's trace features need, per logits row of a tracked sample, the log-normaliser and
the entropy of its next-token distribution (the raw model distribution, before
temperature): ``lse = log Σ_v exp(z_v)`` and ``H = -Σ_v p_v log p_v`` with
``p = softmax(z)``.  A token's log-probability is then ``z_tok - lse`` (one gather), and
the sample's mean / minimum log-probability and mean entropy over its first ``l_detect``
tokens are the features a quality head may read beside the hidden state (ARRoL Fig. 2a,
Sec. 4.2; :data:`vllm_rl.arrol.rule.TRACE_FEATURES`).

Both come from one pass over the row: with a running maximum m, ``S = Σ exp(z - m)`` and
``T = Σ exp(z - m) z``, ``lse = m + log S`` and ``H = lse - T / S`` (since
``log p_v = z_v - lse``).  The kernel writes no ``[rows, V]`` log-softmax (nor
probabilities); the PyTorch path materialises one chunk of rows at a time.

- :func:`triton_logsumexp_entropy`: one Triton program per row, the row gathered by index
  inside the kernel (no copy in torch), ``BLOCK_V`` lanes each keeping its own online
  (m, S, T) over the vocabulary, combined at the end; float32 whatever the logits dtype;
- :func:`torch_logsumexp_entropy`: the same in PyTorch, the CPU path and the reference: per
  chunk of rows (so the float32 temporaries stay bounded) a log-softmax and one entropy
  expression (on the CPU PyTorch's fused log-softmax is faster than its logsumexp);
- :func:`logsumexp_entropy`: Triton for CUDA tensors when Triton imports, else PyTorch
  (``backend=`` or ``VLLM_RL_TRACE_BACKEND``: ``auto`` | ``torch`` | ``triton``).

A ``-inf`` logit (a masked token) has probability 0 and adds nothing to the entropy.  Row
values of ``rows`` are not checked (that would synchronise the device).  Like
:mod:`vllm_rl.kernels.arrol_head` it imports nothing from vllm_rl and Triton only when the
Triton path runs.
"""
from __future__ import annotations

import os

import torch

BACKENDS = ("auto", "torch", "triton")
BACKEND_ENV = "VLLM_RL_TRACE_BACKEND"
CHUNK_ELEMENTS = 1 << 23          # torch path: float32 temporaries of at most 32 MiB
_KERNEL = None


def _check(logits, rows) -> None:
    if logits.dim() != 2:
        raise ValueError(f"logsumexp_entropy logits: expected [N, V], got "
                         f"{tuple(logits.shape)}")
    if rows is not None and (rows.dim() != 1 or rows.dtype not in (torch.int32, torch.int64)):
        raise ValueError(f"logsumexp_entropy rows: expected a 1-d int32/int64 tensor, got "
                         f"{rows.dtype} {tuple(rows.shape)}")


def torch_logsumexp_entropy(logits, rows=None, chunk_elements: int = CHUNK_ELEMENTS):
    """PyTorch path: ``(lse, entropy)``, float32 [R] each, of ``logits[rows]`` (all rows
    when ``rows`` is None).  Rows are taken in chunks of ``chunk_elements // V``: only a
    chunk's log-softmax is ever materialised (float32)."""
    _check(logits, rows)
    n = logits.shape[0] if rows is None else rows.shape[0]
    lse = torch.empty(n, dtype=torch.float32, device=logits.device)
    ent = torch.empty(n, dtype=torch.float32, device=logits.device)
    if rows is not None:
        rows = rows.to(logits.device, torch.int64)
    step = max(1, chunk_elements // max(1, logits.shape[1]))
    for a in range(0, n, step):
        b = min(n, a + step)
        x = (logits[a:b] if rows is None else logits.index_select(0, rows[a:b])).float()
        lp = torch.log_softmax(x, dim=-1)
        # lse = z_j - log p_j at the row's top token j (log p_j ≈ 0: no cancellation)
        top = x.argmax(-1, keepdim=True)
        lse[a:b] = (x.gather(-1, top) - lp.gather(-1, top)).squeeze(-1)
        # H = -Σ p log p; a masked (-inf) logit gives 0 · -inf = NaN there, counted 0
        ent[a:b] = lp.exp().mul_(lp).nan_to_num_(nan=0.0).sum(-1).neg_()
    return lse, ent


def _kernel():
    global _KERNEL
    if _KERNEL is not None:
        return _KERNEL
    import triton
    import triton.language as tl

    @triton.jit
    def lse_entropy_kernel(x_ptr, stride_row, rows_ptr, lse_ptr, ent_ptr, V,
                           HAS_ROWS: tl.constexpr, BLOCK_V: tl.constexpr):
        # One row per program; each of the BLOCK_V lanes keeps an online (m, S, T) over
        # its slice of the vocabulary: S = Σ exp(z - m), T = Σ exp(z - m) z.
        pid = tl.program_id(0)
        if HAS_ROWS:
            row = tl.load(rows_ptr + pid).to(tl.int64)
        else:
            row = pid.to(tl.int64)
        base = x_ptr + row * stride_row
        lanes = tl.arange(0, BLOCK_V)
        m = tl.full((BLOCK_V,), float("-inf"), tl.float32)
        s = tl.zeros((BLOCK_V,), dtype=tl.float32)
        t = tl.zeros((BLOCK_V,), dtype=tl.float32)
        for start in range(0, V, BLOCK_V):
            offs = start + lanes
            z = tl.load(base + offs, mask=offs < V, other=float("-inf")).to(tl.float32)
            m_new = tl.maximum(m, z)
            # a lane that has seen only -inf keeps S = T = 0 (no NaN from -inf - -inf)
            m_ref = tl.where(m_new > float("-inf"), m_new, 0.0)
            scale = tl.exp(m - m_ref)
            p = tl.exp(z - m_ref)
            s = s * scale + p
            t = t * scale + p * tl.where(z > float("-inf"), z, 0.0)
            m = m_new
        mx = tl.max(m, axis=0)
        w = tl.exp(m - tl.where(mx > float("-inf"), mx, 0.0))
        S = tl.sum(s * w, axis=0)
        T = tl.sum(t * w, axis=0)
        lse = mx + tl.log(S)
        tl.store(lse_ptr + pid, lse)
        tl.store(ent_ptr + pid, lse - T / S)

    _KERNEL = (lse_entropy_kernel, triton)
    return _KERNEL


def triton_logsumexp_entropy(logits, rows=None, block_v: int = 1024, num_warps: int = 4):
    """Triton path, same contract as :func:`torch_logsumexp_entropy`: one program per row
    of ``rows`` (or of ``logits``), the row read in place at any row stride.  Needs CUDA
    tensors, or CPU tensors under ``TRITON_INTERPRET=1``."""
    _check(logits, rows)
    kernel, triton = _kernel()
    n = logits.shape[0] if rows is None else int(rows.numel())
    dev = logits.device
    lse = torch.empty(n, dtype=torch.float32, device=dev)
    ent = torch.empty(n, dtype=torch.float32, device=dev)
    if n == 0:
        return lse, ent
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    rows_arg = lse if rows is None else rows.to(dev).contiguous()
    kernel[(n,)](logits, logits.stride(0), rows_arg, lse, ent, logits.shape[1],
                 HAS_ROWS=rows is not None, BLOCK_V=block_v, num_warps=num_warps)
    return lse, ent


def _triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def logsumexp_entropy(logits, rows=None, backend: str | None = None):
    """``(lse, entropy)`` of the rows ``rows`` of ``logits`` [N, V] (every row when None):
    float32 [R] each, ``lse = logsumexp(z)`` and ``entropy = -Σ softmax(z) log softmax(z)``,
    in one pass per row; nothing is copied to the host.

    ``backend``: ``"auto"`` (default; Triton when ``logits.is_cuda`` and Triton imports,
    else PyTorch), ``"torch"`` or ``"triton"``; when None, ``VLLM_RL_TRACE_BACKEND``.
    """
    backend = backend or os.environ.get(BACKEND_ENV) or "auto"
    if backend not in BACKENDS:
        raise ValueError(f"logsumexp_entropy backend={backend!r}: allowed {BACKENDS}")
    if backend == "auto":
        backend = "triton" if logits.is_cuda and _triton_available() else "torch"
    if backend == "triton":
        return triton_logsumexp_entropy(logits, rows)
    return torch_logsumexp_entropy(logits, rows)


__all__ = ["BACKENDS", "BACKEND_ENV", "logsumexp_entropy", "torch_logsumexp_entropy",
           "triton_logsumexp_entropy"]
