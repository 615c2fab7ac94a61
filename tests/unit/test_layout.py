"""The package's layers (docs/ARCHITECTURE.md, "Layers"), checked on the source.

Every module of ``vllm_rl`` (each ``__init__.py`` too, and ``patches/`` and ``kernels/``,
which the package maps in as ``vllm_rl.patches`` and ``vllm_rl.kernels``) belongs to one
layer of :data:`LAYERS`.  A module may import its own layer and the layers below it, never
one above; in a siloed layer (the techniques, the frameworks) a unit imports no other unit of
its layer.  What counts as an import, read from the AST without importing anything:

* every ``import`` / ``from ... import`` anywhere in the file: at module level, inside a
  function (a lazy import is still a dependency), under ``TYPE_CHECKING``; relative imports
  are resolved against the file's package;
* ``from pkg import name`` where ``pkg`` exports ``name`` lazily (a ``vllm_rl.lazy.exports``
  table, or a module ``__getattr__`` that imports on ``if name in (...)``) imports the module
  that defines ``name``;
* a lazy export table (``__getattr__ = exports(__name__, ("rule", ...))``) imports every
  module it names;
* a string constant that is exactly a ``vllm_rl`` module or ``module.attribute`` path (a
  class path vLLM or ``importlib`` imports by name, e.g. ``scheduler_cls``) imports it.

Dependencies are transitive: when A imports B and B imports C, A depends on C, and a
violation is reported with the chain.  The edges of :data:`EXCEPTIONS` are allowed, each
with its reason, and are not followed.
"""
from __future__ import annotations

import ast
import re
from collections import deque
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PKG = "vllm_rl"
# Folders the package maps in as subpackages (vllm_rl/__init__.py in a checkout, setup.py
# in a wheel), and the compiled extension (csrc/), which has no Python source.
MAPPED = {"vllm_rl.patches": ROOT / "patches", "vllm_rl.kernels": ROOT / "kernels"}
COMPILED = ("vllm_rl._C",)

# The layers, bottom to top: (name, its units, siloed).  A module's unit is the longest
# entry that is the module or one of its packages ("vllm_rl" itself: the top-level
# ``__init__.py`` only).  Order and membership follow docs/ARCHITECTURE.md, "Layers".
LAYERS = (
    ("core", ("vllm_rl", "vllm_rl.flags", "vllm_rl.outcome", "vllm_rl.step_output",
              "vllm_rl.checks", "vllm_rl.coins", "vllm_rl.cost", "vllm_rl.lazy",
              "vllm_rl.class_paths"), False),
    ("native", ("vllm_rl.kernels", "vllm_rl._C"), False),
    ("techniques", ("vllm_rl.darts", "vllm_rl.duet", "vllm_rl.das", "vllm_rl.arrol"), True),
    ("engine", ("vllm_rl.engine",), False),
    ("factory", ("vllm_rl.settings", "vllm_rl.rpc", "vllm_rl.llm", "vllm_rl.worker",
                 "vllm_rl.plugin", "vllm_rl.endpoint", "vllm_rl.http_flags", "vllm_rl.metrics",
                 "vllm_rl.weights", "vllm_rl.end_step", "vllm_rl.serve", "vllm_rl.compat",
                 "vllm_rl.patches", "vllm_rl.regime", "vllm_rl.regime_log", "vllm_rl.advice",
                 "vllm_rl.served_regime"),
     False),
    ("integrations", ("vllm_rl.integrations", "vllm_rl.integrations.common"), False),
    ("frameworks", ("vllm_rl.integrations.verl", "vllm_rl.integrations.trl",
                    "vllm_rl.integrations.openrlhf"), True),
    ("tools", ("vllm_rl.bench", "vllm_rl.cli", "vllm_rl.task"), False),
)

# (importer, imported) -> why the upward edge is allowed.  Excepted edges are not followed.
EXCEPTIONS = {
    ("vllm_rl", "vllm_rl.llm"):
        "the facade: `from vllm_rl import LLM, engine_args, server_args` re-exports the engine "
        "factory's public names lazily (its module __getattr__), so `import vllm_rl` imports "
        "no vLLM; a module that imports one of these names from vllm_rl is resolved to "
        "vllm_rl.llm and checked as such",
    ("vllm_rl.class_paths", "vllm_rl.engine.scheduler"):
        "the facade names the RL schedulers as class-path strings (SCHEDULER_CLS, "
        "SYNC_SCHEDULER_CLS) for vLLM's scheduler_cls; naming them imports nothing, vLLM "
        "imports them in the engine process",
    ("vllm_rl.class_paths", "vllm_rl.worker"):
        "the facade names the worker extension as a class-path string "
        "(WORKER_EXTENSION_CLS) for vLLM's worker_extension_cls; vLLM imports it in the "
        "worker process",
}
ALLOWED = dict(EXCEPTIONS)

PATH = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")


# ------------------------------------------------------------------------------ sources
@dataclass
class Module:
    name: str
    path: Path | None               # None: compiled
    is_package: bool = False
    tree: ast.Module | None = None
    names: set[str] = field(default_factory=set)        # top-level names it defines
    lazy: dict[str, set[str]] = field(default_factory=dict)   # lazily exported name -> modules

    @property
    def package(self) -> str:
        return self.name if self.is_package else self.name.rpartition(".")[0]


def _module_name(base: str, rel: Path) -> str:
    parts = list(rel.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([base, *parts])


def _source_files() -> dict[str, Path]:
    out = {}
    for base, folder in ((PKG, ROOT / PKG), *MAPPED.items()):
        for path in sorted(folder.rglob("*.py")):
            out[_module_name(base, path.relative_to(folder))] = path
    return out


def _defined_names(tree: ast.Module) -> set[str]:
    names = set()
    for node in tree.body:
        nodes = [node]
        if isinstance(node, (ast.If, ast.Try)):         # `if TYPE_CHECKING:`, `try: import`
            nodes += [n for n in ast.walk(node) if isinstance(n, ast.stmt)]
        for n in nodes:
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(n.name)
            elif isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = n.targets if isinstance(n, ast.Assign) else [n.target]
                for t in targets:
                    names |= {e.id for e in ast.walk(t) if isinstance(e, ast.Name)}
            elif isinstance(n, (ast.Import, ast.ImportFrom)):
                names |= {(a.asname or a.name).split(".")[0] for a in n.names}
    return names


def _all(tree: ast.Module) -> list[str]:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            try:
                return list(ast.literal_eval(node.value))
            except ValueError:
                return []
    return []


def _exports_table(tree: ast.Module) -> tuple[str | None, list[str]]:
    """``__getattr__ = exports(package, (modules...))``: (package, modules)."""
    for node in tree.body:
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
                and isinstance(node.value.func, (ast.Name, ast.Attribute))
                and getattr(node.value.func, "id", getattr(node.value.func, "attr", None))
                == "exports" and len(node.value.args) == 2):
            pkg, mods = node.value.args
            package = (pkg.value if isinstance(pkg, ast.Constant)
                       else "__name__" if isinstance(pkg, ast.Name) else None)
            try:
                return package, list(ast.literal_eval(mods))
            except ValueError:
                return package, []
    return None, []


class Graph:
    """The package's modules and their import edges, from the source alone."""

    def __init__(self, sources: dict[str, str], packages: set[str],
                 paths: dict[str, Path] | None = None, compiled: tuple[str, ...] = ()) -> None:
        self.modules: dict[str, Module] = {}
        for name, text in sources.items():
            self.modules[name] = Module(name, (paths or {}).get(name), name in packages,
                                        ast.parse(text))
        for name in compiled:
            self.modules[name] = Module(name, None)
        for mod in self.modules.values():
            if mod.tree is not None:
                mod.names = _defined_names(mod.tree)
        for mod in self.modules.values():
            if mod.tree is not None:
                mod.lazy = self._lazy_names(mod)
        self.edges: dict[str, dict[str, str]] = {
            name: self._edges(mod) for name, mod in self.modules.items()}

    # -------------------------------------------------------------- resolution
    @staticmethod
    def absolute(mod: Module, node: ast.ImportFrom) -> str:
        """The absolute module a ``from ... import`` names (relative ones resolved)."""
        if not node.level:
            return node.module or ""
        base = mod.package.split(".")
        base = base[:len(base) - (node.level - 1)]
        return ".".join(base + ([node.module] if node.module else []))

    def _lazy_names(self, mod: Module) -> dict[str, set[str]]:
        """Names a module exports lazily -> the modules that define them."""
        out: dict[str, set[str]] = {}
        package, listed = _exports_table(mod.tree)
        if package is not None:
            package = mod.name if package == "__name__" else package
            for sub in listed:
                target = self.modules.get(f"{package}.{sub}")
                for name in (_all(target.tree) if target and target.tree else ()):
                    out.setdefault(name, set()).add(target.name)
        for fn in mod.tree.body:
            if not (isinstance(fn, ast.FunctionDef) and fn.name == "__getattr__"):
                continue
            for node in ast.walk(fn):
                if not (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
                        and isinstance(node.test.ops[0], ast.In)):
                    continue
                right = node.test.comparators[0]
                if isinstance(right, ast.Name) and right.id == "__all__":
                    names = _all(mod.tree)
                else:
                    try:
                        names = list(ast.literal_eval(right))
                    except ValueError:
                        continue
                targets = set()
                for stmt in node.body:
                    for n in ast.walk(stmt):
                        targets |= self._import_targets(mod, n, lazy=False)
                for name in names:
                    out.setdefault(name, set()).update(targets)
        return out

    def _import_targets(self, mod: Module, node: ast.AST, lazy: bool = True) -> set[str]:
        out = set()
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == PKG:
                    out.add(alias.name)         # not a module: test_every_import_resolves
        elif isinstance(node, ast.ImportFrom):
            base = self.absolute(mod, node)
            if base.split(".")[0] != PKG:
                return out
            for alias in node.names:
                full = f"{base}.{alias.name}"
                owner = self.modules.get(base)
                if full in self.modules:
                    out.add(full)
                elif lazy and owner is not None and alias.name in owner.lazy:
                    out |= owner.lazy[alias.name]
                elif owner is not None and owner.tree is not None and alias.name != "*" \
                        and alias.name not in owner.names | set(owner.lazy):
                    out.add(full)               # no such name: test_every_import_resolves
                else:
                    out.add(base)
        return out

    def _string_target(self, text: str) -> str | None:
        """The module a class-path or module-path string names, or None."""
        if not PATH.fullmatch(text) or text.split(".")[0] != PKG:
            return None
        if text in self.modules:
            return text
        owner, _, attr = text.rpartition(".")
        mod = self.modules.get(owner)
        if mod is not None and (attr in mod.names or attr in mod.lazy or mod.tree is None):
            return owner
        return None

    def _edges(self, mod: Module) -> dict[str, str]:
        """Imported module -> how (for the messages)."""
        out: dict[str, str] = {}
        if mod.tree is None:
            return out
        docstrings = {id(n.value) for n in ast.walk(mod.tree) if isinstance(n, ast.Expr)}
        for node in ast.walk(mod.tree):
            line = getattr(node, "lineno", 0)
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for target in self._import_targets(mod, node):
                    out.setdefault(target, f"import, line {line}")
            elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
                  and id(node) not in docstrings):
                target = self._string_target(node.value)
                if target is not None:
                    out.setdefault(target, f"the string {node.value!r}, line {line}")
        package, listed = _exports_table(mod.tree)
        if package is not None:
            package = mod.name if package == "__name__" else package
            for sub in listed:
                out.setdefault(f"{package}.{sub}", "lazy export table")
        out.pop(mod.name, None)
        return out

    # -------------------------------------------------------------- layers
    def chains(self, start: str) -> dict[str, list[str]]:
        """Every module ``start`` depends on -> the shortest import chain to it, over every
        edge except the allowed exceptions."""
        seen = {start: [start]}
        todo = deque([start])
        while todo:
            here = todo.popleft()
            for target in self.edges.get(here, {}):
                if target in seen or (here, target) in ALLOWED:
                    continue
                seen[target] = seen[here] + [target]
                todo.append(target)
        del seen[start]
        return seen


def unit_of(module: str) -> tuple[int, str, str, bool] | None:
    """(rank, layer, unit, siloed) of a module, or None if it has no layer."""
    best = None
    for rank, (layer, units, siloed) in enumerate(LAYERS):
        for unit in units:
            hit = module == unit or (unit != PKG and module.startswith(unit + "."))
            if hit and (best is None or len(unit) > len(best[2])):
                best = (rank, layer, unit, siloed)
    return best


def violates(importer: str, imported: str) -> bool:
    a, b = unit_of(importer), unit_of(imported)
    if a is None or b is None:
        return True
    if b[0] != a[0]:
        return b[0] > a[0]
    return a[3] and a[2] != b[2]


@cache
def graph() -> Graph:
    files = _source_files()
    return Graph({n: p.read_text() for n, p in files.items()},
                 {n for n, p in files.items() if p.name == "__init__.py"}, files, COMPILED)


def _describe(module: str) -> str:
    u = unit_of(module)
    return f"{module} [{u[1] if u else 'no layer'}]"


MODULES = sorted(_source_files())


# ------------------------------------------------------------------------------ tests
def test_every_module_has_a_layer():
    assert len(MODULES) > 50
    assert {"vllm_rl", "vllm_rl.patches", "vllm_rl.kernels", "vllm_rl.engine",
            "vllm_rl.integrations.common"} <= set(MODULES)
    missing = [m for m in MODULES + list(COMPILED) if unit_of(m) is None]
    assert not missing, f"no layer in LAYERS for {missing}"
    units = [u for _, us, _ in LAYERS for u in us]
    assert len(units) == len(set(units))


@pytest.mark.parametrize("module", MODULES)
def test_imports_point_down(module):
    g = graph()
    bad = []
    for target, chain in sorted(g.chains(module).items()):
        if target.split(".")[0] == PKG and violates(module, target):
            steps = " -> ".join(chain)
            last = g.edges[chain[-2]][target]
            bad.append(f"{_describe(module)} depends on {_describe(target)}: {steps} "
                       f"({chain[-2]}: {last})")
    assert not bad, "\n".join(bad)


def test_every_import_resolves_to_a_module():
    g = graph()
    bad = [f"{m} imports {t} ({how})" for m, edges in g.edges.items()
           for t, how in edges.items() if t not in g.modules]
    assert not bad, "\n".join(bad)


def import_cycles(edges: dict[str, dict[str, str]]) -> list[list[str]]:
    """The strongly connected sets of modules (Tarjan) over the import edges, lazy imports
    in functions included; a class path named as a string (which vLLM or verl resolves)
    imports nothing and is left out."""
    graph = {m: [t for t, how in e.items() if t != m and not how.startswith("the string")]
             for m, e in edges.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    g = graph()
    cycles = import_cycles(g.edges)
    assert not cycles, "\n".join(
        " <-> ".join(c) + ": " + "; ".join(f"{a} -> {b} ({g.edges[a][b]})" for a in c
                                           for b in g.edges[a] if b in c)
        for c in cycles)
    assert import_cycles({"a": {"b": "import, line 1"}, "b": {"a": "import, line 9"}}) \
        == [["a", "b"]]
    assert import_cycles({"a": {"b": "import, line 1"},
                          "b": {"a": "the string 'a.X', line 2"}}) == []


def test_every_exception_is_needed():
    g = graph()
    for (importer, imported), reason in EXCEPTIONS.items():
        assert reason and imported in g.edges.get(importer, {}), \
            f"stale exception: {importer} no longer imports {imported}"
        assert violates(importer, imported), f"{importer} -> {imported} needs no exception"


def test_the_graph_sees_every_kind_of_import():
    """The resolver on a made-up package: relative, lazy, in-function, string edges."""
    sources = {
        "vllm_rl": "from vllm_rl.a import x\nSCHED = 'vllm_rl.c.mod.Cls'\n"
                   "def __getattr__(name):\n"
                   "    if name in ('Big',):\n"
                   "        from vllm_rl import c\n"
                   "        return c.Big\n",
        "vllm_rl.a": "x = 1\n",
        "vllm_rl.b": "from vllm_rl.lazy import exports\n"
                     "__getattr__ = exports(__name__, ('rule',))\n",
        "vllm_rl.b.rule": "from . import helper\nfrom ..a import x\n__all__ = ['Rule']\n"
                          "class Rule:\n    pass\n",
        "vllm_rl.b.helper": "def f():\n    import vllm_rl.c.mod\n",
        "vllm_rl.c": "from vllm_rl import Big\nfrom vllm_rl.b import Rule\n",
        "vllm_rl.c.mod": '"""vllm_rl.a in a docstring is no import."""\nclass Cls:\n    pass\n',
        "vllm_rl.lazy": "def exports(package, modules):\n    pass\n",
    }
    g = Graph(sources, {"vllm_rl", "vllm_rl.b", "vllm_rl.c"})
    assert set(g.edges["vllm_rl"]) == {"vllm_rl.a", "vllm_rl.c", "vllm_rl.c.mod"}
    assert set(g.edges["vllm_rl.b"]) == {"vllm_rl.lazy", "vllm_rl.b.rule"}
    assert set(g.edges["vllm_rl.b.rule"]) == {"vllm_rl.b.helper", "vllm_rl.a"}
    assert set(g.edges["vllm_rl.b.helper"]) == {"vllm_rl.c.mod"}
    assert set(g.edges["vllm_rl.c"]) == {"vllm_rl.b.rule"}
    assert g.edges["vllm_rl.c.mod"] == {}
    assert g.chains("vllm_rl.b")["vllm_rl.c.mod"] == [
        "vllm_rl.b", "vllm_rl.b.rule", "vllm_rl.b.helper", "vllm_rl.c.mod"]


def test_the_rule():
    assert violates("vllm_rl.flags", "vllm_rl.darts.rule")            # core -> technique
    assert violates("vllm_rl.darts.rule", "vllm_rl.duet.rule")        # technique -> technique
    assert not violates("vllm_rl.darts.rule", "vllm_rl.darts.rollout_budget")
    assert not violates("vllm_rl.arrol.scorer", "vllm_rl.kernels.arrol_head")
    assert violates("vllm_rl.engine.trace", "vllm_rl.settings")
    assert not violates("vllm_rl.settings", "vllm_rl.engine.trace")
    assert violates("vllm_rl.integrations.openrlhf.launcher", "vllm_rl.integrations.verl")
    assert not violates("vllm_rl.integrations.verl.loss", "vllm_rl.integrations.common.marks")
    assert violates("vllm_rl.integrations.common.marks", "vllm_rl.integrations.trl.rollout")
    assert violates("vllm_rl.serve", "vllm_rl.cli.serve")
    assert not violates("vllm_rl.cli.serve", "vllm_rl.task")


def test_every_technique_folder_has_a_rule_or_drafter_and_a_controller_or_budget_model():
    for unit in LAYERS[2][1]:
        folder = ROOT / Path(*unit.split("."))
        names = {p.stem for p in folder.glob("*.py")}
        assert names & {"rule", "drafter"} and names & {"controller", "budget_model"}, unit


def _listed(doc: str, tag: str) -> str:
    start, end = doc.index(f"<!-- {tag}"), doc.index(f"<!-- /{tag} -->")
    return doc[start:end]


def test_architecture_lists_the_patches_and_overrides_the_code_has():
    """docs/ARCHITECTURE.md's patch list is the registry's (each patch's class, module
    and targets), and its scheduler override list is the classes' own."""
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    import vllm_rl.patches as patches

    from vllm_rl.engine.scheduler import RLScheduler

    doc = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    listed = _listed(doc, "patches")
    items = re.findall(r"^- `([\w/]+)\.py` `(\w+)`", listed, re.M)
    found = patches.all_patches()
    assert sorted(name for _, name in items) == sorted(p.name() for p in found)
    for module, name in items:
        patch = next(p for p in found if p.name() == name)
        assert patch.__module__ == "vllm_rl.patches." + module.replace("/", "."), name
        item = listed[listed.index(f"`{name}`"):].split("\n- ", 1)[0]
        for target in patch.targets:
            assert target.rsplit(".", 1)[-1] in item, (name, target)
    own = {n for k in RLScheduler.__mro__ if k.__module__.startswith("vllm_rl")
           for n, v in vars(k).items() if callable(v) and hasattr(AsyncScheduler, n)}
    overrides = set(re.findall(r"`(\w+)`", _listed(doc, "overrides")))
    assert overrides == own
