"""Kernels of vllm_rl, importable as ``vllm_rl.kernels`` (torch is imported on first use).

- :func:`score_rows`: ARRoL's quality head (paper Sec. 4.2: 2-layer MLP, 128 hidden,
  sigmoid) over gathered rows of a step's hidden states; Triton on CUDA, PyTorch on the
  CPU (:mod:`vllm_rl.kernels.arrol_head`, with ``torch_score_rows`` and
  ``triton_score_rows``).
"""

__all__ = ["score_rows", "torch_score_rows", "triton_score_rows"]


def __getattr__(name):
    if name in __all__:
        from . import arrol_head

        return getattr(arrol_head, name)
    raise AttributeError(f"module 'vllm_rl.kernels' has no attribute {name!r}")
