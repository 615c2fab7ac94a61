"""The package's layers: imports point from the technique folders to the core, never
back, and never from one technique to another (docs/ARCHITECTURE.md, "Layers")."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "vllm_rl"
CORE = ("flags", "outcome", "checks", "coins", "cost", "lazy")
TECHNIQUES = ("darts", "duet", "das", "arrol")


def _modules(folder: str) -> list[Path]:
    path = PKG / folder
    return sorted(path.rglob("*.py")) if path.is_dir() else [path.with_suffix(".py")]


def _imports(path: Path) -> set[str]:
    """Every vllm_rl module a file imports, at module level or inside a function."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "vllm_rl":
                out |= {f"vllm_rl.{a.name}" for a in node.names}
            elif node.module.startswith("vllm_rl."):
                out.add(node.module)
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("vllm_rl.")}
    return out


def _top(module: str) -> str:
    return module.split(".")[1]


@pytest.mark.parametrize("folder", CORE)
def test_the_core_imports_no_technique(folder):
    for path in _modules(folder):
        bad = {m for m in _imports(path) if _top(m) not in CORE + ("task", "kernels", "_C")}
        bad -= {"vllm_rl.SCHEDULER_CLS", "vllm_rl.SYNC_SCHEDULER_CLS"}
        assert not bad, f"{path.relative_to(PKG)} imports {sorted(bad)}"


@pytest.mark.parametrize("folder", TECHNIQUES)
def test_a_technique_imports_the_core_and_itself(folder):
    allowed = set(CORE) | {folder, "kernels", "_C", "task", "WORKER_EXTENSION_CLS",
                           "SYNC_SCHEDULER_CLS", "SCHEDULER_CLS"}
    for path in _modules(folder):
        bad = {m for m in _imports(path) if _top(m) not in allowed}
        assert not bad, f"{path.relative_to(PKG)} imports {sorted(bad)}"


def test_every_technique_folder_has_a_rule_or_drafter_and_a_controller_or_budget():
    for folder in TECHNIQUES:
        names = {p.stem for p in (PKG / folder).glob("*.py")}
        assert names & {"rule", "drafter"} and names & {"controller", "budget"}, folder
