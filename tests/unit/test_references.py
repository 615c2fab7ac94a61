"""References to the package's own modules and objects in docstrings and comments resolve.

A reference is read from the source alone (the AST of the module it names; nothing is
imported), in these forms:

* a Sphinx role, ``:func:`vllm_rl.x.f```, ``:class:`~.rule.Calibration```, ``:meth:`Cls.m```:
  absolute targets; relative ones (a leading dot: the current module, its packages, then any
  module the target is a suffix of, as Sphinx searches); dotted ones whose head is a name of
  the current module (a class, an imported module) or a top-level module of the package;
* a plain ``vllm_rl.x.y`` path in the text (a quoted one is a flag key or a logger name, and
  is skipped);
* a backticked path under the package without its prefix (```darts.rule.annotate_group```)
  whose head is a folder of the package (a technique, ``integrations``, ``cost``...).

A reference resolves when its module exists and each attribute after it is defined there (a
top-level name, a lazily exported one, a class member); what cannot be told statically (an
attribute of an external base class, of a function's result) is skipped.  Bare one-word
role targets (``:func:`decide```) are checked in the current module and then anywhere in the
package, and skipped when no module of the package defines them (vLLM's and PyTorch's names).
"""
from __future__ import annotations

import ast
import io
import re
import tokenize
from functools import cache

import pytest
from test_layout import PKG, ROOT, Graph, Module, graph

ROLE = re.compile(r":(?:py:)?(mod|func|class|meth|data|attr|exc|obj|const):`!?~?([^`]+)`")
PLAIN = re.compile(r"(?<![\w/\"'.:=-])vllm_rl(?:\.[A-Za-z_]\w*)+(?![\w\"'-])")
TICKED = re.compile(r"(?<!:)``?([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)``?")
# Heads of an unprefixed backticked path that name a folder of the package (a module name
# like ``llm`` or ``settings`` is also a common variable name: ambiguous, not checked).
FOLDERS = ("darts", "duet", "das", "arrol", "cost", "engine", "integrations", "compat",
           "bench", "cli", "task", "patches", "kernels")
# Base classes that add no member a docstring would name.
EMPTY_BASES = ("object", "ABC", "abc.ABC", "Protocol", "typing.Protocol", "Exception",
               "ValueError", "RuntimeError")


@cache
def flag_fields() -> dict[str, set[str]]:
    """The flags, ``{section: fields}``, from ``vllm_rl.flags`` (``SECTIONS`` and each
    section's ``<Section>Flags`` dataclass).  A flag is named ``[vllm_rl.]<section>.<field>``
    (``vllm_rl.darts.mode``), the same shape as a module path: such a name is a flag."""
    tree = graph().modules["vllm_rl.flags"].tree
    sections = next(ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                    and any(isinstance(t, ast.Name) and t.id == "SECTIONS" for t in n.targets))
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    return {s: {f.target.id for f in classes[f"{s.title()}Flags"].body
                if isinstance(f, ast.AnnAssign) and isinstance(f.target, ast.Name)}
            for s in sections}


def is_flag(parts: list[str]) -> bool:
    """``[section, field]``: a flag's name."""
    return len(parts) == 2 and parts[1] in flag_fields().get(parts[0], ())


# ------------------------------------------------------------------------------ resolution
def _class_members(node: ast.ClassDef) -> set[str]:
    out = set()
    for stmt in node.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(stmt.name)
        elif isinstance(stmt, (ast.Assign, ast.AnnAssign)):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            out |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    for n in ast.walk(node):        # self.x = ... in the methods
        if (isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)
                and isinstance(n.value, ast.Name) and n.value.id == "self"):
            out.add(n.attr)
    return out


@cache
def _bindings(name: str) -> dict[str, str]:
    """Names a module binds by import -> the dotted path they stand for."""
    mod = graph().modules[name]
    out: dict[str, str] = {}
    for node in ast.walk(mod.tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                out[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            base = Graph.absolute(mod, node)
            for a in node.names:
                out[a.asname or a.name] = f"{base}.{a.name}"
    return out


def _classes(mod: Module) -> dict[str, ast.ClassDef]:
    return {n.name: n for n in mod.tree.body if isinstance(n, ast.ClassDef)}


def resolve(dotted: str, _seen: frozenset = frozenset()) -> bool | None:
    """True: ``dotted`` names a module of the package or an object in one; False: it does
    not; None: cannot be told from the source."""
    g = graph()
    parts = dotted.split(".")
    if parts[0] != PKG or dotted in _seen:
        return None
    for i in range(len(parts), 0, -1):
        if ".".join(parts[:i]) in g.modules:
            return _attr(g.modules[".".join(parts[:i])], parts[i:], _seen | {dotted})
    return False


def _attr(mod: Module, rest: list[str], seen: frozenset) -> bool | None:
    if not rest:
        return True
    if mod.tree is None:                    # compiled
        return None
    head = rest[0]
    if head in mod.lazy:
        found = [resolve(".".join([t, *rest]), seen) for t in sorted(mod.lazy[head])]
        return True if True in found else None if None in found else False
    if head not in mod.names:
        return False
    if len(rest) == 1:
        return True
    bound = _bindings(mod.name).get(head)
    if bound is not None:
        return resolve(".".join([bound, *rest[1:]]), seen)
    cls = _classes(mod).get(head)
    if cls is None:
        return None                         # an attribute of a function or a value
    if rest[1] in _class_members(cls):
        return True if len(rest) == 2 else None
    verdicts = []
    for base in cls.bases:                  # inherited: from a base class of the package
        name = ast.unparse(base)
        if name in EMPTY_BASES:
            verdicts.append(False)
        elif name in _classes(mod):
            verdicts.append(_attr(mod, [name, *rest[1:]], seen))
        elif name.split(".")[0] in _bindings(mod.name):
            head_path = _bindings(mod.name)[name.split(".")[0]]
            verdicts.append(resolve(".".join([head_path, *name.split(".")[1:], *rest[1:]]),
                                    seen))
        else:
            verdicts.append(None)
    return True if True in verdicts else None if None in verdicts else False


def _in_package(mod: Module) -> list[str]:
    """The module, then its packages, innermost first."""
    parts = mod.name.split(".")
    return [".".join(parts[:i]) for i in range(len(parts), 0, -1)]


def _anywhere(target: str) -> bool | None:
    """A suffix search over the package, as Sphinx does for ``.target``."""
    g = graph()
    parts = target.split(".")
    verdicts = []
    for name, mod in g.modules.items():
        for i in range(len(parts) + 1):
            head, rest = ".".join(parts[:i]), parts[i:]
            if i and not (name == head or name.endswith("." + head)):
                continue
            if i == 0 and mod.tree is None:
                continue                    # compiled: any name might be there
            if i == 0:
                cls_hit = any(rest[0] in _class_members(c) for c in _classes(mod).values())
                verdicts.append(True if len(rest) == 1 and cls_hit else _attr(mod, rest,
                                                                              frozenset()))
            else:
                verdicts.append(_attr(mod, rest, frozenset()))
    return True if True in verdicts else None if None in verdicts else False


def check_role(target: str, mod: Module, kind: str = "obj") -> bool | None:
    target = re.sub(r"\s+", "", target.split("<")[-1].rstrip(">")).lstrip("~")
    target = target.split("(")[0]
    if not re.fullmatch(r"\.?[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*", target):
        return None
    if kind == "mod":                       # a module, nothing else
        names = graph().modules
        if target.startswith("."):
            rel = target[1:]
            return any(f"{p}.{rel}" in names or p.endswith("." + rel) for p in names)
        if target.split(".")[0] == PKG:
            return target in names
        return None
    if target.startswith(PKG + ".") or target == PKG:
        return resolve(target)
    if target.startswith("."):
        rel = target[1:]
        local = [resolve(f"{p}.{rel}") for p in _in_package(mod)]
        if True in local:
            return True
        return _anywhere(rel)
    parts = target.split(".")
    if len(parts) == 1:                     # a bare name: here, else anywhere in the package
        if mod.tree is not None and (target in mod.names or target in mod.lazy or any(
                target in _class_members(c) for c in _classes(mod).values())):
            return True
        return True if _anywhere(target) else None
    head = parts[0]
    if mod.tree is not None and head in mod.names:
        return _attr(mod, parts, frozenset())
    if head in {p.split(".")[1] for p in graph().modules if p.count(".") >= 1}:
        return resolve(f"{PKG}.{target}")
    owners = [m for m in graph().modules.values() if m.tree is not None and head in _classes(m)]
    verdicts = [_attr(m, parts, frozenset()) for m in owners]    # a class of another module
    return True if True in verdicts else None if None in verdicts or not verdicts else False


# ------------------------------------------------------------------------------ the texts
def _texts(mod: Module) -> list[tuple[int, str]]:
    """(line, text) of every docstring and comment of a module."""
    out = [(n.lineno, n.value.value) for n in ast.walk(mod.tree)
           if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)
           and isinstance(n.value.value, str)]
    source = mod.path.read_text()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            out.append((tok.start[0], tok.string))
    return out


def references(mod: Module) -> list[tuple[int, str, str]]:
    """(line, reference as written, its form) in a module's docstrings and comments."""
    out = []
    for first, text in _texts(mod):
        def at(m: re.Match) -> int:
            return first + text.count("\n", 0, m.start())

        out += [(at(m), m.group(2), m.group(1)) for m in ROLE.finditer(text)]
        rest = ROLE.sub(lambda m: " " * len(m.group(0)), text)     # the same offsets
        out += [(at(m), m.group(0), "plain") for m in PLAIN.finditer(rest)]
        out += [(at(m), m.group(1), "ticked") for m in TICKED.finditer(rest)
                if m.group(1).split(".")[0] in FOLDERS]
    return sorted(out)


def check(mod: Module, ref: str, form: str) -> bool | None:
    """``form``: a role's kind (``mod``, ``func``...), ``plain`` or ``ticked``."""
    if form not in ("plain", "ticked"):
        return check_role(ref, mod, form)
    if form == "plain":
        return None if is_flag(ref.split(".")[1:]) else resolve(ref)
    return None if is_flag(ref.split(".")) else resolve(f"{PKG}.{ref}")


MODULES = sorted(n for n, m in graph().modules.items() if m.tree is not None)


@pytest.mark.parametrize("module", MODULES)
def test_references_resolve(module):
    mod = graph().modules[module]
    where = mod.path.relative_to(ROOT)
    stale = [f"{where}:{line}: {ref}" for line, ref, form in references(mod)
             if check(mod, ref, form) is False]
    assert not stale, "stale references:\n" + "\n".join(stale)


def test_the_checker_finds_stale_references():
    assert resolve("vllm_rl.darts.rule.annotate_group")
    assert resolve("vllm_rl.outcome.annotate_group") is False
    assert resolve("vllm_rl.integrations.trl.rollout.RolloutFunc")
    assert resolve("vllm_rl.integrations.trl.RolloutFunc") is False
    assert resolve("vllm_rl.arrol.CalibrationBuffer")           # lazily exported
    assert resolve("vllm_rl.arrol.head.CalibrationBuffer") is False
    assert resolve("vllm_rl.cost.StepCost.step_ms")             # re-exported, a method
    assert resolve("vllm_rl.cost.StepCost.no_such_method") is False
    assert resolve("vllm_rl.LLM")                                # the facade's lazy name
    assert resolve("vllm_rl.no_such_module") is False
    drafter = graph().modules["vllm_rl.das.drafter"]
    assert check_role("length_classes.LengthClasses", drafter)  # an imported module
    assert check_role("policy.estimate_k_many",                   # an import alias
                      graph().modules["vllm_rl.das.draft_lengths"])
    assert check_role(".batch_caps.cost_cap", drafter)
    assert check_role("~.batch_caps.no_such_cap", drafter) is False
    assert check_role("vllm.LLM", drafter) is None              # not ours
    common = graph().modules["vllm_rl.integrations.common"]
    assert check_role(".marks", common, "mod")
    assert check_role(".feedback", common, "mod") is False
    assert check_role("vllm_rl.das.batch_caps.cost_cap", common, "mod") is False
    marks = graph().modules["vllm_rl.integrations.common.marks"]
    text = "(:func:`vllm_rl.outcome.annotate_group`) and ``darts.rule.nothing`` " \
           "{\"vllm_rl.darts.mode\": 1}"
    found = [(r, f) for f, r in ROLE.findall(text)]
    found += [(m.group(0), "plain") for m in PLAIN.finditer(ROLE.sub(" ", text))]
    found += [(m.group(1), "ticked") for m in TICKED.finditer(ROLE.sub(" ", text))]
    assert found == [("vllm_rl.outcome.annotate_group", "func"),
                     ("darts.rule.nothing", "ticked")]
    assert [check(marks, r, f) for r, f in found] == [False, False]


# ------------------------------------------------------------------ docs/ARCHITECTURE.md
#: The installed frameworks whose names the map cites (vLLM's methods, verl's hooks).
FRAMEWORKS = ("vllm", "verl", "trl", "openrlhf")


@cache
def _code_words() -> tuple[frozenset[str], str, tuple[str, ...]]:
    """Every identifier in the project's code and the frameworks' sources, the project's
    code as text, and the project's file paths."""
    import importlib.util
    from pathlib import Path

    texts, paths = [], []
    for folder in ("vllm_rl", "patches", "kernels", "csrc", "tests", "scripts", "examples",
                   "benchmarks", ".ci", "docs"):
        for f in (ROOT / folder).rglob("*"):
            if f.is_file() and "__pycache__" not in f.parts:
                paths.append("/" + f.relative_to(ROOT).as_posix())
                if f.suffix in (".py", ".cpp", ".h", ".sh", ".yaml", ".toml", ".txt", ""):
                    texts.append(f.read_text(errors="ignore"))
    own = "\n".join(texts)
    theirs = []
    for name in FRAMEWORKS:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.origin:
            theirs += [f.read_text(errors="ignore") for f in Path(spec.origin).parent.rglob("*.py")]
    words = frozenset(re.findall(r"[A-Za-z_]\w*", own + "\n".join(theirs)))
    return words, own, tuple(paths)


def architecture_misses(doc: str) -> list[str]:
    """The backticked names and paths of ``doc`` that the code does not have: a dotted name
    (``RLSchedulerMixin.reset_prefix_cache``) whose every part is an identifier of the
    project's code or of a framework it extends; a file or folder (``common/partial.py``)
    that is a tail of a project path, or that the code names (vLLM's own tests, run from
    its sdist)."""
    words, own, paths = _code_words()
    misses = []
    for token in sorted(set(re.findall(r"`([^`\n]+)`", doc))):
        t = token.strip()
        if re.fullmatch(r"[\w.-]+(/[\w.-]+)*/?", t) and ("/" in t or re.search(
                r"\.(py|json|yaml|md|sh|cpp|h)$", t)):
            tail = "/" + t.rstrip("/")
            if not (any(p.endswith(tail) or (tail + "/") in p for p in paths) or t in own):
                misses.append(t)
            continue
        m = re.fullmatch(r"([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)(\(\))?", t)
        if m and any(part not in words for part in m.group(1).split(".")):
            misses.append(t)
    return misses


def test_every_name_the_architecture_cites_exists():
    doc = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    assert not architecture_misses(doc), architecture_misses(doc)
    method, path = "no_such" + "_method_here", "engine/" + "nowhere" + "_at_all.py"
    assert architecture_misses(f"`RLSchedulerMixin.{method}`, `{path}`, "
                               "`engine/scheduler.py`, `reset_prefix_cache`") == sorted(
        [f"RLSchedulerMixin.{method}", path])
