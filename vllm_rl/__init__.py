"""vllm-rl: a vLLM engine for RL rollouts (DARTS, DUET, DAS, ARRoL), switched on per request.

    from vllm_rl import LLM, rl_params, RolloutInfo
    llm = LLM("Qwen/Qwen3-8B")                    # your model: a path or a Hugging Face id
    sp = SamplingParams(n=16, max_tokens=256,
                        extra_args=rl_params(group={"size": 8}, darts={"mode": "shortest"}))
    for out in llm.generate(prompts, sp):
        for c in out.outputs:
            c.rollout_info                        # RolloutInfo: reason, weight, length, ...

The demo kit (the embedded model ``MODEL_PATH``, its prompt sets and its verifier) is
:mod:`vllm_rl.task`.
"""
from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

from vllm_rl.class_paths import SCHEDULER_CLS, SYNC_SCHEDULER_CLS, WORKER_EXTENSION_CLS
from vllm_rl.flags import FlagError, RLFlags, rl_params, rl_xargs
from vllm_rl.outcome import Reason, RolloutInfo

__version__ = "0.1.0"



def _map_source_folders() -> None:
    """In a source checkout, import the top-level ``patches/`` as ``vllm_rl.patches``.

    An installed wheel has them inside the package already (setup.py maps them).
    """
    here = Path(__file__).resolve().parent
    for name in ("patches", "kernels"):
        full = f"{__name__}.{name}"
        src = here.parent / name / "__init__.py"
        if full in sys.modules or (here / name).exists() or not src.exists():
            continue
        spec = importlib.util.spec_from_file_location(
            full, src, submodule_search_locations=[str(src.parent)])
        module = importlib.util.module_from_spec(spec)
        sys.modules[full] = module
        spec.loader.exec_module(module)
        globals()[name] = module


_map_source_folders()


def __getattr__(name: str):
    # vLLM is imported only when the engine is asked for.
    if name in ("LLM", "engine_args", "server_args"):
        from vllm_rl import llm

        return getattr(llm, name)
    raise AttributeError(f"module 'vllm_rl' has no attribute {name!r}")


__all__ = ["LLM", "engine_args", "server_args", "rl_params", "rl_xargs", "RLFlags", "FlagError",
           "RolloutInfo", "Reason", "SCHEDULER_CLS", "SYNC_SCHEDULER_CLS", "WORKER_EXTENSION_CLS"]
