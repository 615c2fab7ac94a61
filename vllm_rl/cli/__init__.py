"""The ``vllm-rl`` command: ``serve``, ``bench``, ``advise`` and ``serve-bench`` (:mod:`.main`)."""
from __future__ import annotations


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point (``vllm-rl = vllm_rl.cli:main``)."""
    from vllm_rl.cli.main import main as _main

    return _main(argv)


__all__ = ["main"]
