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
