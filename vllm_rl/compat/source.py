"""vLLM's sources as the patch and contract checks read them: a file tree, or the installed package.

Every ``check(source)`` of ``patches/`` and of :mod:`vllm_rl.compat.contracts` reads vLLM
through one of these, so the same check runs on the vLLM this process uses and on any
release's sources (an unpacked wheel, a ``site-packages``) without importing that vLLM:

* :class:`SourceTree` parses the files (``ast``) and never imports them.  Classes, their
  bases (followed through ``from ... import``) and methods are found statically.
* :class:`InstalledSource` is the tree of the installed ``vllm``, except that methods and
  functions are those of the *live* objects (a test's monkeypatch is seen; a vllm_rl patch
  wrapper is unwrapped to vLLM's own function) with their signatures from ``inspect``.

The helpers at the end match AST shapes (an assignment ``params = request.params``, a call
``self._free_request(...)``), so a check cannot be fooled by a substring in another line.
"""
from __future__ import annotations

import ast
import re
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

FunctionNode = (ast.FunctionDef, ast.AsyncFunctionDef)


class SourceMissing(LookupError):
    """A module, class, method or function is not in the sources."""


@dataclass
class Def:
    """A function or method found in the sources."""

    node: ast.FunctionDef | ast.AsyncFunctionDef
    owner: str                   # "vllm.v1.core.sched.scheduler.Scheduler" or the module
    params: tuple[str, ...]      # positional-or-keyword parameter names, in order
    defaults: dict[str, str] = field(default_factory=dict)   # name -> default, as source


def _params(node: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[tuple[str, ...], dict]:
    a = node.args
    positional = [*a.posonlyargs, *a.args]
    names = tuple(p.arg for p in positional) + tuple(p.arg for p in a.kwonlyargs)
    defaults = {p.arg: ast.unparse(d)
                for p, d in zip(positional[len(positional) - len(a.defaults):], a.defaults)}
    defaults.update({p.arg: ast.unparse(d) for p, d in zip(a.kwonlyargs, a.kw_defaults)
                     if d is not None})
    return names, defaults


class SourceTree:
    """vLLM's Python sources under ``root``, the folder that holds the ``vllm`` package."""

    def __init__(self, root: str | Path, label: str | None = None,
                 version: str | None = None) -> None:
        self.root = Path(root)
        if not (self.root / "vllm" / "__init__.py").is_file():
            raise FileNotFoundError(f"{self.root}: no vllm/__init__.py (not a vLLM source tree)")
        self.label = label or str(self.root)
        self._version = version
        self._modules: dict[str, ast.Module] = {}

    # ------------------------------------------------------------------ version
    @property
    def version(self) -> str:
        if self._version is None:
            self._version = self._read_version()
        return self._version

    def _read_version(self) -> str:
        path = self.root / "vllm" / "_version.py"
        if path.is_file():
            for node in ast.walk(ast.parse(path.read_text())):
                if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
                        and any(isinstance(t, ast.Name) and t.id == "__version__"
                                for t in node.targets)):
                    return str(node.value.value)
        for meta in sorted(self.root.glob("vllm*.dist-info/METADATA")):
            found = re.search(r"^Version: *(\S+)", meta.read_text(errors="replace"), re.M)
            if found:
                return found.group(1)
        return "unknown"

    # ------------------------------------------------------------------ modules
    def path(self, module: str) -> Path | None:
        base = self.root.joinpath(*module.split("."))
        for p in (base.with_suffix(".py"), base / "__init__.py"):
            if p.is_file():
                return p
        return None

    def has_module(self, module: str) -> bool:
        return self.path(module) is not None

    def is_package(self, module: str) -> bool:
        p = self.path(module)
        return p is not None and p.name == "__init__.py"

    def module(self, module: str) -> ast.Module:
        tree = self._modules.get(module)
        if tree is None:
            p = self.path(module)
            if p is None:
                raise SourceMissing(f"module {module}")
            tree = self._modules[module] = ast.parse(p.read_text(encoding="utf-8"), str(p))
        return tree

    def text(self, module: str) -> str:
        p = self.path(module)
        if p is None:
            raise SourceMissing(f"module {module}")
        return p.read_text(encoding="utf-8")

    # ------------------------------------------------------------------ names
    def _bindings(self, module: str) -> Iterator[ast.stmt]:
        """Module-level statements, including those under ``if``/``try`` blocks."""
        todo = list(self.module(module).body)
        while todo:
            node = todo.pop(0)
            yield node
            if isinstance(node, (ast.If, ast.Try)):
                todo[:0] = [*node.body, *node.orelse,
                            *(s for h in getattr(node, "handlers", ()) for s in h.body),
                            *getattr(node, "finalbody", ())]

    def _absolute(self, module: str, node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        package = module if self.is_package(module) else module.rpartition(".")[0]
        for _ in range(node.level - 1):
            package = package.rpartition(".")[0]
        return f"{package}.{node.module}" if node.module else package

    def defines(self, module: str, name: str, _depth: int = 0) -> bool:
        """Whether ``module`` binds ``name`` at module level (def, class, assignment,
        import, also under ``if TYPE_CHECKING``), has it as a submodule, or names it in a
        lazy module ``__getattr__``'s table (a string constant ``name``)."""
        if self.has_module(f"{module}.{name}"):
            return True
        if not self.has_module(module) or _depth > 20:
            return False
        lazy = False
        for node in self._bindings(module):
            if isinstance(node, (ast.ClassDef, *FunctionNode)):
                if node.name == name:
                    return True
                lazy |= node.name == "__getattr__"
            targets = []
            if isinstance(node, ast.Assign):
                targets = [n for t in node.targets for n in ast.walk(t)]
            elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
                targets = [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                return True
            if isinstance(node, ast.Import):
                if any((a.asname or a.name.split(".")[0]) == name for a in node.names):
                    return True
            elif isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if (alias.asname or alias.name) == name:
                        return True
                    if alias.name == "*" and self.defines(self._absolute(module, node), name,
                                                          _depth + 1):
                        return True
        return lazy and any(isinstance(n, ast.Constant) and n.value == name
                            for n in ast.walk(self.module(module)))

    def resolve(self, module: str, name: str, _depth: int = 0) -> tuple[str, str] | None:
        """``(module, name)`` where a name bound in ``module`` is defined, following
        ``from x import name`` re-exports; None when it leaves vLLM or is not found."""
        if _depth > 20 or not self.has_module(module):
            return None
        for node in self._bindings(module):
            if isinstance(node, (ast.ClassDef, *FunctionNode)) and node.name == name:
                return module, name
        for node in self._bindings(module):
            if isinstance(node, ast.ImportFrom):
                source = self._absolute(module, node)
                for alias in node.names:
                    if (alias.asname or alias.name) == name:
                        if self.has_module(f"{source}.{alias.name}"):
                            return None                       # a submodule, not a class
                        return self.resolve(source, alias.name, _depth + 1)
        return None

    # ------------------------------------------------------------------ classes
    def cls(self, module: str, name: str) -> ast.ClassDef:
        found = self.resolve(module, name)
        if found is not None:
            for node in self._bindings(found[0]):
                if isinstance(node, ast.ClassDef) and node.name == found[1]:
                    return node
        raise SourceMissing(f"class {module}.{name}")

    def class_module(self, module: str, name: str) -> str:
        found = self.resolve(module, name)
        if found is None:
            raise SourceMissing(f"class {module}.{name}")
        return found[0]

    def bases(self, module: str, name: str) -> list[tuple[str, str]]:
        """The vLLM classes ``module.name`` derives from directly, as ``(module, name)``."""
        home = self.class_module(module, name)
        out = []
        for base in self.cls(module, name).bases:
            if isinstance(base, ast.Subscript):            # Generic[T], Base[X]
                base = base.value
            if isinstance(base, ast.Name):
                found = self.resolve(home, base.id)
            elif isinstance(base, ast.Attribute):
                dotted = ast.unparse(base.value)
                found = self.resolve(dotted, base.attr) if dotted.startswith("vllm") else None
            else:
                found = None
            if found is not None:
                out.append(found)
        return out

    def mro(self, module: str, name: str) -> list[tuple[str, str]]:
        """The class and its vLLM bases, depth first left to right, each once (classes
        outside vLLM, such as ``ABC`` or ``torch.nn.Module``, are left out)."""
        seen: list[tuple[str, str]] = []

        def visit(mod: str, cls: str) -> None:
            key = (self.class_module(mod, cls), cls)
            if key in seen:
                return
            seen.append(key)
            for base in self.bases(*key):
                visit(*base)

        visit(module, name)
        return seen

    def is_subclass(self, module: str, name: str, base_module: str, base: str) -> bool:
        target = (self.class_module(base_module, base), base)
        return target in self.mro(module, name)

    @staticmethod
    def own_method(node: ast.ClassDef, name: str):
        for item in node.body:
            if isinstance(item, FunctionNode) and item.name == name:
                return item
        return None

    def methods(self, module: str, cls: str, name: str) -> list[Def]:
        """Every definition of ``name`` along the class's MRO, nearest first (the chain
        that ``super()`` calls walk)."""
        out = []
        for mod, klass in self.mro(module, cls):
            node = self.own_method(self.cls(mod, klass), name)
            if node is not None:
                params, defaults = _params(node)
                out.append(Def(node, f"{mod}.{klass}", params, defaults))
        return out

    def method(self, module: str, cls: str, name: str) -> Def:
        """The method ``cls.name`` resolves to (its own, or the nearest base's)."""
        found = self.methods(module, cls, name)
        if not found:
            raise SourceMissing(f"{module}.{cls}.{name}")
        return found[0]

    def function(self, module: str, name: str) -> Def:
        for node in self._bindings(module):
            if isinstance(node, FunctionNode) and node.name == name:
                params, defaults = _params(node)
                return Def(node, module, params, defaults)
        raise SourceMissing(f"{module}.{name}")

    def fields(self, module: str, cls: str) -> set[str]:
        """Names a class declares: annotated class attributes (dataclass, NamedTuple,
        msgspec fields), methods and properties, and ``self.x = ...`` in any of its
        methods, along its vLLM MRO."""
        names: set[str] = set()
        for mod, klass in self.mro(module, cls):
            node = self.cls(mod, klass)
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    names.add(item.target.id)
                elif isinstance(item, ast.Assign):
                    names.update(t.id for t in item.targets if isinstance(t, ast.Name))
                elif isinstance(item, FunctionNode):
                    names.add(item.name)
                    names.update(self_attrs_assigned(item))
        return names


class InstalledSource(SourceTree):
    """The installed ``vllm``: its files, with methods and functions read from the live
    objects (a monkeypatched method is what is checked; vllm_rl's own patch wrappers are
    unwrapped to vLLM's function) and their parameters from ``inspect.signature``."""

    def __init__(self) -> None:
        import vllm

        super().__init__(Path(vllm.__file__).resolve().parent.parent, label="installed",
                         version=vllm.__version__)

    @staticmethod
    def _live(obj) -> Def | None:
        import inspect

        obj = getattr(obj, "__wrapped__", obj)
        try:
            text = textwrap.dedent(inspect.getsource(obj))
            node = next(n for n in ast.parse(text).body if isinstance(n, FunctionNode))
            params = tuple(inspect.signature(obj).parameters)
        except (OSError, TypeError, StopIteration, SyntaxError, ValueError):
            return None
        _, defaults = _params(node)
        return Def(node, "", params, defaults)

    def methods(self, module: str, cls: str, name: str) -> list[Def]:
        import importlib

        try:
            live_cls = getattr(importlib.import_module(module), cls)
        except (ImportError, AttributeError):
            return super().methods(module, cls, name)
        out = []
        for klass in live_cls.__mro__:
            if name in vars(klass):
                found = self._live(vars(klass)[name])
                if found is not None:
                    found.owner = f"{klass.__module__}.{klass.__qualname__}"
                    out.append(found)
        return out or super().methods(module, cls, name)

    def function(self, module: str, name: str) -> Def:
        import importlib

        found = self._live(getattr(importlib.import_module(module), name, None))
        if found is None:
            return super().function(module, name)
        found.owner = module
        return found

    def is_subclass(self, module: str, name: str, base_module: str, base: str) -> bool:
        import importlib

        try:
            cls = getattr(importlib.import_module(module), name)
            parent = getattr(importlib.import_module(base_module), base)
        except (ImportError, AttributeError):
            return super().is_subclass(module, name, base_module, base)
        return issubclass(cls, parent)


_INSTALLED: InstalledSource | None = None


def installed_source() -> InstalledSource:
    """One :class:`InstalledSource` per process (the files' parses are kept; methods are
    read from the live objects at every call)."""
    global _INSTALLED
    if _INSTALLED is None:
        _INSTALLED = InstalledSource()
    return _INSTALLED


# ---------------------------------------------------------------------------- AST shapes
def walk(node: ast.AST | list) -> Iterator[ast.AST]:
    for n in (node if isinstance(node, list) else [node]):
        yield from ast.walk(n)


def calls(node, name: str, receiver: str | None = None) -> list[ast.Call]:
    """Calls of ``name(...)`` or ``x.name(...)`` (``receiver``: ``x`` as source, e.g.
    ``"self"``), in source order."""
    out = []
    for n in walk(node):
        if not isinstance(n, ast.Call):
            continue
        f = n.func
        if isinstance(f, ast.Name) and f.id == name and receiver is None:
            out.append(n)
        elif isinstance(f, ast.Attribute) and f.attr == name and (
                receiver is None or ast.unparse(f.value) == receiver):
            out.append(n)
    return sorted(out, key=lambda c: (c.lineno, c.col_offset))


def name_calls(node, name: str) -> list[ast.Call]:
    """Calls of the bare name ``name(...)`` (a module-global lookup)."""
    return [c for c in calls(node, name) if isinstance(c.func, ast.Name)]


def is_attr(node: ast.AST, owner: str, attr: str) -> bool:
    """``node`` is ``owner.attr`` (``owner`` as source, e.g. ``"self"``, ``"request"``)."""
    return (isinstance(node, ast.Attribute) and node.attr == attr
            and ast.unparse(node.value) == owner)


def assignments(node, target: str) -> list[ast.Assign | ast.AnnAssign]:
    """Assignments whose target is exactly ``target`` (source text: ``"params"``,
    ``"self.execute_model_state"``, ``"request.status"``), in source order."""
    out = []
    for n in walk(node):
        if isinstance(n, ast.Assign):
            if any(ast.unparse(t) == target for t in n.targets):
                out.append(n)
        elif isinstance(n, ast.AnnAssign) and n.value is not None:
            if ast.unparse(n.target) == target:
                out.append(n)
    return sorted(out, key=lambda a: a.lineno)


def self_attrs_assigned(fn: ast.AST) -> set[str]:
    out = set()
    for n in ast.walk(fn):
        targets = (n.targets if isinstance(n, ast.Assign)
                   else [n.target] if isinstance(n, (ast.AnnAssign, ast.AugAssign)) else [])
        for t in targets:
            for x in ast.walk(t):
                if isinstance(x, ast.Attribute) and isinstance(x.value, ast.Name) \
                        and x.value.id == "self":
                    out.add(x.attr)
    return out
