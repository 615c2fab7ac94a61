"""Send vLLM's log lines to a file, so a benchmark's terminal shows its progress and tables.

Call :func:`vllm_log_to` before vLLM is imported.  Engine processes started in
multiprocess mode inherit ``VLLM_CONFIGURE_LOGGING=0`` and print only warnings.
"""
from __future__ import annotations

import logging
import os
import warnings
from pathlib import Path


def vllm_log_to(path: str | os.PathLike) -> Path:
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
    print(f"vLLM's log: {path}")
    return path


def quiet_vllm(out_dir: str | os.PathLike) -> None:
    """:func:`vllm_log_to` ``out_dir/vllm.log``, unless vLLM is already imported (a suite
    run from ``rollout.py`` is quiet already)."""
    import sys

    if "vllm" not in sys.modules:
        vllm_log_to(Path(out_dir) / "vllm.log")
