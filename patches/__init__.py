"""The smallest patches of vLLM internals, one module per patched internal.

Each module names the internal it touches (``TARGET``), the vLLM versions it was
checked against (``CHECKED``), a ``check()`` that fails loudly when the installed
vLLM no longer has the shape the patch relies on, and an idempotent ``apply()``.
The top-level ``patches/`` folder is importable as ``vllm_rl.patches``.
"""
from __future__ import annotations

import importlib

MODULES = ("input_validation", "proposer_context", "cpu_spec_expand")


class PatchMismatch(RuntimeError):
    """The installed vLLM does not match what a patch was written against."""


def all_patches():
    return [importlib.import_module(f"{__name__}.{m}") for m in MODULES]


def apply_all() -> None:
    for mod in all_patches():
        mod.check()
        mod.apply()
