"""vLLM general-plugin entry point (``vllm.general_plugins: vllm_rl``), and the switch
that asks for the patches.

vLLM calls :func:`register` in every process it starts (front end, engine core, workers)
once vllm_rl is installed.  It applies the patches of ``vllm_rl.patches`` only in a
process whose environment has :data:`~vllm_rl.class_paths.ENGINE_ENV` set to ``"1"``:
:func:`enable` sets it, and the RL engine's factories call :func:`enable` (through
:meth:`vllm_rl.settings.EngineSettings.engine_kwargs`; ``vllm-rl serve`` puts it in the
server's environment, :meth:`~vllm_rl.settings.EngineSettings.env`).  The engine's
processes inherit the variable, so they patch themselves when vLLM loads the plugin.  Any
other process, a plain ``vllm serve`` or a ``vllm.LLM`` beside an installed vllm_rl, runs
vLLM's own code.  Patches are process-wide: in a process that has built an RL engine, an
engine built later runs through them too, and a request without RL flags goes through
them untouched.
"""
from __future__ import annotations

import os

from vllm_rl.class_paths import ENGINE_ENV, patches_asked


def register() -> None:
    """vLLM's plugin hook: apply the patches where the RL engine was asked for (once per
    process: the registry remembers them); elsewhere, nothing."""
    if patches_asked():
        from vllm_rl.patches import apply_all

        apply_all()


def enable() -> None:
    """Ask for the RL engine in this process and the ones it starts: set
    :data:`ENGINE_ENV` and apply the patches here."""
    os.environ[ENGINE_ENV] = "1"
    register()


__all__ = ["ENGINE_ENV", "enable", "register"]
