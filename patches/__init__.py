"""The one registry of vLLM patches: the smallest changes where vLLM has no hook.

Every patch is a :class:`Patch` subclass in the module named for the vLLM module it
touches (``patches/<vllm module>.py``, or a folder of them for the model runner).  It
names its ``targets`` (dotted paths of the attributes it replaces or adds), the vLLM
versions it was ``checked`` on, a ``check(source=None)`` that fails loudly
(:class:`PatchMismatch`) when vLLM no longer has the shape it relies on, and ``_apply``.
``check()`` reads the installed vLLM (its live objects: what ``_apply`` will patch);
``check(tree)`` reads any release's sources without importing them
(:mod:`vllm_rl.compat.source`, ``python -m vllm_rl.compat.check VERSION``).

The registry keeps three rules (as ArcticInference's ``patching.py`` keeps one place
for its patches):

* two patches on one target raise :class:`PatchConflict`, unless one names the other in
  ``after``: it is then applied later, so its wrapper runs outside the other's;
* a patch is applied once per process: the registry remembers it (:func:`applied`),
  not a marker attribute that ``functools.wraps`` would copy onto a wrapper;
* :func:`apply_all` checks every patch before it applies any.

The top-level ``patches/`` folder is importable as ``vllm_rl.patches``.
"""
from __future__ import annotations

import importlib
from typing import Callable, ClassVar

CHECKED = ("0.32.0", "0.33.0")
# The modules holding patches, by the vLLM module each touches.
MODULES = ("compilation", "config", "input_processor", "output_processor", "outputs",
           "openai_serving", "engine_core", "input_batch", "rejection_sampler",
           "model_runner.arrol_capture", "model_runner.das_context",
           "model_runner.das_async")


class PatchMismatch(RuntimeError):
    """The installed vLLM does not match what a patch was written against."""


class PatchConflict(RuntimeError):
    """Two patches replace one target and neither declares its order."""


class Patch:
    """One patch of vLLM internals (module docstring).  Subclasses set ``targets`` and
    give ``check(source=None)`` and ``_apply()`` (as class keywords, or as methods);
    :func:`all_patches` refuses a patch without them."""

    targets: ClassVar[tuple[str, ...]] = ()
    checked: ClassVar[tuple[str, ...]] = CHECKED
    after: ClassVar[tuple[str, ...]] = ()     # names of patches applied before this one

    def __init_subclass__(cls, check: Callable | None = None, apply: Callable | None = None,
                          **kwargs) -> None:
        """``class P(Patch, check=fn, apply=fn)``: the module's check and apply functions."""
        super().__init_subclass__(**kwargs)
        if check is not None:
            cls.check = staticmethod(check)
        if apply is not None:
            cls._apply = staticmethod(apply)

    @classmethod
    def name(cls) -> str:
        return cls.__name__

    @classmethod
    def apply(cls) -> None:
        """Apply once per process (the registry remembers it)."""
        if cls in _APPLIED:
            return
        for name in cls.after:
            before = _by_name(name)
            if before not in _APPLIED:
                raise PatchConflict(f"{cls.name()} goes outside {name}'s wrapper: apply "
                                    f"{name} first (apply_all orders them)")
        cls._apply()
        _APPLIED.add(cls)


_APPLIED: set[type[Patch]] = set()


def applied(patch: type[Patch]) -> bool:
    """Whether ``patch`` is applied in this process."""
    return patch in _APPLIED


def all_patches() -> list[type[Patch]]:
    """Every patch, in the order they apply (a patch after those it names in ``after``),
    after checking that no two share a target without a declared order."""
    found: list[type[Patch]] = []
    for module in MODULES:
        mod = importlib.import_module(f"{__name__}.{module}")
        found.extend(v for v in vars(mod).values() if isinstance(v, type)
                     and issubclass(v, Patch) and v is not Patch and v.__module__ == mod.__name__)
    incomplete = [p.__name__ for p in found
                  if not (callable(getattr(p, "check", None)) and callable(getattr(p, "_apply", None)))]
    if incomplete:
        raise TypeError(f"patches without check or apply: {incomplete}")
    _check_targets(found)
    return _ordered(found)


def _by_name(name: str) -> type[Patch]:
    for patch in all_patches():
        if patch.name() == name:
            return patch
    raise KeyError(f"no patch named {name}")


def _check_targets(patches: list[type[Patch]]) -> None:
    owner: dict[str, type[Patch]] = {}
    names = {p.name() for p in patches}
    for patch in patches:
        missing = [n for n in patch.after if n not in names]
        if missing:
            raise PatchConflict(f"{patch.name()} names unknown patches in after: {missing}")
        for target in patch.targets:
            other = owner.get(target)
            if other is not None and other.name() not in patch.after \
                    and patch.name() not in other.after:
                raise PatchConflict(f"{other.name()} and {patch.name()} both patch {target}: "
                                    f"declare their order with `after`")
            owner.setdefault(target, patch)


def _ordered(patches: list[type[Patch]]) -> list[type[Patch]]:
    by_name = {p.name(): p for p in patches}
    done: list[type[Patch]] = []
    seen: set[str] = set()

    def visit(patch: type[Patch], path: tuple[str, ...]) -> None:
        if patch.name() in path:
            raise PatchConflict(f"patch order cycle: {' -> '.join(path + (patch.name(),))}")
        if patch.name() in seen:
            return
        for name in patch.after:
            visit(by_name[name], path + (patch.name(),))
        seen.add(patch.name())
        done.append(patch)

    for patch in patches:
        visit(patch, ())
    return done


def apply_all() -> None:
    """Check every patch against the installed vLLM, then apply each once, in order."""
    todo = [p for p in all_patches() if p not in _APPLIED]
    for patch in todo:
        patch.check()
    for patch in todo:
        patch.apply()


# -- helpers for the checks ------------------------------------------------------------
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
