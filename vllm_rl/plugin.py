"""vLLM general-plugin entry point (``vllm.general_plugins: vllm_rl``).

vLLM calls :func:`register` in every process it starts (front end, engine core,
workers) when ``vllm_rl`` is installed.  It applies the patches of ``vllm_rl.patches``;
a request without RL flags goes through them untouched.  The scheduler itself is chosen
per engine (``scheduler_cls``), so installing vllm_rl never changes a stock engine.
"""
from __future__ import annotations

_applied = False


def register() -> None:
    global _applied
    if _applied:
        return
    from vllm_rl.patches import apply_all

    apply_all()
    _applied = True
