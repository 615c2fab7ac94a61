"""The smallest patches of vLLM internals, one module per patched internal.

Each module names the internal it touches (``TARGET``), the vLLM versions it was
checked against (``CHECKED``), a ``check()`` that fails loudly when the installed
vLLM no longer has the shape the patch relies on, and an idempotent ``apply()``.
The top-level ``patches/`` folder is importable as ``vllm_rl.patches``.
"""
from __future__ import annotations

import importlib
import inspect
from typing import Any, Callable

MODULES = ("input_validation", "proposer_context", "cpu_spec_expand", "arrol_capture",
           "output_metrics")


class PatchMismatch(RuntimeError):
    """The installed vLLM does not match what a patch was written against."""


def checked_target(owner: Any, attr: str, target: str, checked: tuple[str, ...],
                   expected_params: tuple[str, ...]) -> tuple[Callable, str]:
    """vLLM's own ``owner.attr`` (unwrapped if patched) and a "where" text for errors,
    after checking that it exists and that its leading parameters are ``expected_params``."""
    import vllm

    where = f"in vLLM {vllm.__version__} (patch checked on {', '.join(checked)})"
    fn = getattr(owner, attr, None)
    fn = getattr(fn, "__wrapped__", fn)
    if fn is None:
        raise PatchMismatch(f"{target} is gone {where}")
    names = tuple(inspect.signature(fn).parameters)[:len(expected_params)]
    if names != expected_params:
        raise PatchMismatch(f"{target} takes {names}, not {expected_params}, {where}")
    return fn, where


def all_patches():
    return [importlib.import_module(f"{__name__}.{m}") for m in MODULES]


def apply_all() -> None:
    for mod in all_patches():
        mod.check()
        mod.apply()
