"""Lazy package exports: a technique package's public names without importing its modules
until one is asked for (so ``from vllm_rl.arrol import ArrolFeedback`` imports no engine
code, and importing a package costs nothing)."""
from __future__ import annotations

import importlib
from typing import Any, Callable


def exports(package: str, modules: tuple[str, ...]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: a name in one of ``modules``' ``__all__``
    (searched in order) is imported from there on first use."""
    def __getattr__(name: str) -> Any:
        for module in modules:
            mod = importlib.import_module(f"{package}.{module}")
            if name in getattr(mod, "__all__", ()):
                return getattr(mod, name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__


__all__ = ["exports"]
