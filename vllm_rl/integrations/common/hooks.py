"""Hooks into Python's imports that the framework integrations share: :func:`after_import`
runs code right after a framework's module has been imported (verl's agent-loop and trainer
registries, OpenRLHF's experience maker), without importing it first."""
from __future__ import annotations

import importlib.abc
import sys
from typing import Callable


class _AfterImport(importlib.abc.MetaPathFinder):
    """Run a hook right after a module's body has run (the first time it is imported)."""

    def __init__(self) -> None:
        self.hooks: dict[str, list[Callable]] = {}

    def find_spec(self, name, path, target=None):
        if name not in self.hooks:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        hooks, run_body = self.hooks.pop(name), spec.loader.exec_module

        def exec_module(module):
            run_body(module)
            for hook in hooks:
                hook(module)

        spec.loader.exec_module = exec_module
        return spec


_after = _AfterImport()


def after_import(name: str, hook: Callable) -> None:
    """``hook(module)`` now if ``name`` is imported already, else right after its import."""
    if name in sys.modules:
        hook(sys.modules[name])
        return
    if _after not in sys.meta_path:
        sys.meta_path.insert(0, _after)
    _after.hooks.setdefault(name, []).append(hook)


__all__ = ["after_import"]
