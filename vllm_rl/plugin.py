"""vLLM general-plugin entry point (``vllm.general_plugins: vllm_rl``).

vLLM calls :func:`register` in every process it starts (front end, engine core,
workers) when ``vllm_rl`` is installed.  It applies the patches of ``vllm_rl.patches``;
a request without RL flags goes through them untouched.  The scheduler itself is chosen
per engine (``scheduler_cls``), so installing vllm_rl never changes a stock engine.
"""
from __future__ import annotations


def register() -> None:
    """Apply the patches (once per process: the registry remembers them)."""
    from vllm_rl.patches import apply_all

    apply_all()
