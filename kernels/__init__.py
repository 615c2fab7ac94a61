"""Kernels of vllm_rl, importable as ``vllm_rl.kernels`` (torch is imported on first use).

- :func:`score_rows`: ARRoL's quality head (paper Sec. 4.2: 2-layer MLP, 128 hidden,
  sigmoid) over gathered rows of a step's hidden states; Triton on CUDA, PyTorch on the
  CPU (:mod:`vllm_rl.kernels.arrol_head`, with ``torch_score_rows`` and
  ``triton_score_rows``).
- :func:`logsumexp_entropy`: the log-normaliser and the entropy of chosen logits rows in
  one pass (ARRoL's trace features, :mod:`vllm_rl.kernels.trace_stats`, with
  ``torch_logsumexp_entropy`` and ``triton_logsumexp_entropy``).
"""

__all__ = ["score_rows", "torch_score_rows", "triton_score_rows", "logsumexp_entropy",
           "torch_logsumexp_entropy", "triton_logsumexp_entropy"]


def __getattr__(name):
    if name in ("score_rows", "torch_score_rows", "triton_score_rows"):
        from . import arrol_head

        return getattr(arrol_head, name)
    if name in ("logsumexp_entropy", "torch_logsumexp_entropy", "triton_logsumexp_entropy"):
        from . import trace_stats

        return getattr(trace_stats, name)
    raise AttributeError(f"module 'vllm_rl.kernels' has no attribute {name!r}")
