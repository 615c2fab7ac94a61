"""Speculative decoding for RL rollouts: the DAS drafter (Distribution-Aware Speculative
decoding, Sec. 4.1).

:mod:`vllm_rl.spec.suffix_tree` holds the suffix structure the drafter is built on (a
C++ extension, ``vllm_rl._C``).  It is imported on first use, so importing this package
needs neither vLLM nor the compiled extension.
"""
from __future__ import annotations

__all__ = ["SuffixTree", "Draft", "UnknownSequenceError", "draft_many"]


def __getattr__(name: str):
    if name in __all__:
        from vllm_rl.spec import suffix_tree

        return getattr(suffix_tree, name)
    raise AttributeError(f"module 'vllm_rl.spec' has no attribute {name!r}")
