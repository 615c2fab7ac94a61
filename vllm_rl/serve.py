"""``python -m vllm_rl.serve MODEL [any vllm serve flag]``: the same as ``vllm-rl serve``.

Kept for scripts that call the module; :mod:`vllm_rl.cli.serve` does the work (vLLM's own
``serve`` on the RL engine, ``--das`` / ``--arrol`` / ``--stock``, the version shim for the
CPU wheel, the ``/vllm_rl/...`` routes).
"""
from __future__ import annotations

from vllm_rl.cli.serve import main

if __name__ == "__main__":
    main()
