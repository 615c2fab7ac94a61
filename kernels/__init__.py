"""Kernels of vllm_rl, importable as ``vllm_rl.kernels`` (torch is imported on first use).

- :func:`score_rows`: ARRoL's quality head over gathered rows of a step's hidden states
  (:mod:`vllm_rl.kernels.arrol_head`).
"""


def __getattr__(name):
    if name in ("score_rows", "torch_score_rows", "triton_score_rows"):
        from . import arrol_head

        return getattr(arrol_head, name)
    raise AttributeError(f"module 'vllm_rl.kernels' has no attribute {name!r}")
