"""Send vLLM's log lines to a file, so a benchmark's terminal shows its progress and tables.

:func:`vllm_log_to` is :func:`vllm_rl.bench.logs.vllm_log_to` (call it before vLLM is
imported); :func:`quiet_vllm` sends them to ``out_dir/vllm.log`` unless vLLM is already
imported (a suite run from ``rollout.py`` is quiet already).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from vllm_rl.bench.logs import vllm_log_to

__all__ = ["quiet_vllm", "vllm_log_to"]


def quiet_vllm(out_dir: str | os.PathLike) -> None:
    if "vllm" not in sys.modules:
        vllm_log_to(Path(out_dir) / "vllm.log")
