"""The smallest patches of vLLM internals, one module per patched internal.

Each module names the internal it touches (``TARGET``), the vLLM versions it was
checked against (``CHECKED``), a ``check(source=None)`` that fails loudly when vLLM no
longer has the shape the patch relies on, and an idempotent ``apply()``.  ``check()``
reads the installed vLLM (its live objects: what ``apply()`` will patch); ``check(tree)``
reads any release's sources without importing them (:mod:`vllm_rl.compat.source`,
``python -m vllm_rl.compat.check VERSION``).  The top-level ``patches/`` folder is
importable as ``vllm_rl.patches``.
"""
from __future__ import annotations

import importlib
import inspect
from typing import Any, Callable

MODULES = ("flags_admission", "das_proposer_context", "das_async", "das_cpu_spec_expand",
           "arrol_capture",
           "metrics_records", "weight_sync", "cpu_seeded_chunks")


class PatchMismatch(RuntimeError):
    """The installed vLLM does not match what a patch was written against."""


def source_of(source=None):
    """The sources a check reads: ``source`` (a :class:`~vllm_rl.compat.source.SourceTree`)
    or, by default, the installed vLLM."""
    if source is not None:
        return source
    from vllm_rl.compat.source import installed_source

    return installed_source()


def where_text(src, checked: tuple[str, ...]) -> str:
    origin = "" if src.label == "installed" else f" at {src.label}"
    return f"in vLLM {src.version}{origin} (patch checked on {', '.join(checked)})"


def _need_params(found, target: str, expected: tuple[str, ...], where: str):
    names = found.params[:len(expected)]
    if names != expected:
        raise PatchMismatch(f"{target} takes {names}, not {expected}, {where}")
    return found


def target_method(src, module: str, cls: str, attr: str, target: str,
                  checked: tuple[str, ...], expected_params: tuple[str, ...]):
    """vLLM's ``module.cls.attr`` (a :class:`~vllm_rl.compat.source.Def`) and a "where"
    text for errors, after checking that it exists and that its leading parameters are
    ``expected_params``."""
    from vllm_rl.compat.source import SourceMissing

    where = where_text(src, checked)
    try:
        found = src.method(module, cls, attr)
    except SourceMissing:
        raise PatchMismatch(f"{target} is gone {where}") from None
    return _need_params(found, target, expected_params, where), where


def target_function(src, module: str, name: str, target: str, checked: tuple[str, ...],
                    expected_params: tuple[str, ...]):
    """Like :func:`target_method`, for a module-level function."""
    from vllm_rl.compat.source import SourceMissing

    where = where_text(src, checked)
    try:
        found = src.function(module, name)
    except SourceMissing:
        raise PatchMismatch(f"{target} is gone {where}") from None
    return _need_params(found, target, expected_params, where), where


def checked_target(owner: Any, attr: str, target: str, checked: tuple[str, ...],
                   expected_params: tuple[str, ...]) -> tuple[Callable, str]:
    """vLLM's own ``owner.attr`` (unwrapped if patched) and a "where" text for errors,
    after checking that it exists and that its leading parameters are ``expected_params``
    (the installed vLLM's live objects only; the checks use :func:`target_method`)."""
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
