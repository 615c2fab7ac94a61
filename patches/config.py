"""Let a DAS engine schedule asynchronously, and the CPU build test that path.

Patched internals:

* ``vllm.config.vllm.VllmConfig.__post_init__`` (:class:`DasAsyncConfig`).  vLLM allows
  async scheduling only with speculative methods whose drafts stay on the GPU
  (EAGLE/MTP, draft model, ``ngram_gpu``, DSpark, DFlash) and turns it off for
  ``custom_class``.  While the config of a DAS engine that asks for it
  (``DASConfig.async_scheduling``, the DAS proposer named in
  ``speculative_config.model``) is checked, ``custom_class`` counts as one of
  ``NgramGPUTypes`` (the module global that check reads, and nothing else in that method
  does); any other engine is checked as vLLM checks it.  The global is swapped for the
  length of that one call, under a lock: vLLM builds an engine's config on one thread,
  and a config built on another thread in that window would see the swapped global too.
* ``vllm.platforms.cpu.CpuPlatform.check_and_update_config`` (:class:`CpuAsyncScheduling`,
  CPU only).  vLLM's CPU platform turns async scheduling off for every engine ("not
  required on CPU").  An engine whose ``additional_config`` has ``vllm_rl_async_cpu:
  true`` keeps the async scheduling it resolved to, so the CPU build runs and tests the
  asynchronous path (stock engines in the benches take the same key, to compare like
  with like).
"""
from __future__ import annotations

import functools
import threading

from . import CHECKED, Patch, PatchMismatch

TARGET_CONFIG = "vllm.config.vllm.VllmConfig.__post_init__"
TARGET_GLOBAL = "vllm.config.vllm.NgramGPUTypes"     # swapped during that one call
CPU_ASYNC_KEY = "vllm_rl_async_cpu"   # additional_config: keep async scheduling on the CPU
TARGET_CPU = "vllm.platforms.cpu.CpuPlatform.check_and_update_config"
_SWAP = threading.Lock()


def wants_async(vllm_config) -> bool:
    """A DAS engine that asked for async scheduling (``DASConfig.async_scheduling``)."""
    from vllm_rl.das.config import DASConfig

    spec = getattr(vllm_config, "speculative_config", None)
    if spec is None or spec.method != "custom_class":
        return False
    cfg = DASConfig.from_vllm_config(vllm_config)
    return cfg is not None and cfg.async_scheduling


def _check_config(source=None) -> None:
    import ast

    from . import source_of, target_method

    src = source_of(source)
    post, where = target_method(src, "vllm.config.vllm", "VllmConfig", "__post_init__",
                                TARGET_CONFIG, CHECKED, ("self",))
    body = ast.unparse(post.node)
    if "get_args(NgramGPUTypes)" not in body or "async_scheduling" not in body:
        raise PatchMismatch(f"{TARGET_CONFIG} no longer checks async scheduling against "
                            f"get_args(NgramGPUTypes) {where}")
    if not src.defines("vllm.config.vllm", "NgramGPUTypes"):
        raise PatchMismatch(f"vllm.config.vllm no longer imports NgramGPUTypes {where}")


def _apply_config() -> None:
    from typing import Literal, get_args

    from vllm.config import vllm as config_module

    cls = config_module.VllmConfig
    original = cls.__post_init__
    vllm_types = config_module.NgramGPUTypes
    with_custom = Literal[(*get_args(vllm_types), "custom_class")]

    @functools.wraps(original)
    def __post_init__(self):
        if not wants_async(self):
            return original(self)
        if self.parallel_config.tensor_parallel_size * \
                self.parallel_config.pipeline_parallel_size > 1:
            raise ValueError("DASConfig.async_scheduling is checked with one worker only "
                             "(tensor and pipeline parallel size 1); pass "
                             "das={'async_scheduling': False} for a parallel engine")
        with _SWAP:
            config_module.NgramGPUTypes = with_custom
            try:
                return original(self)
            finally:
                config_module.NgramGPUTypes = vllm_types

    cls.__post_init__ = __post_init__


def _check_cpu(source=None) -> None:
    from . import source_of, target_method

    target_method(source_of(source), "vllm.platforms.cpu", "CpuPlatform",
                  "check_and_update_config", TARGET_CPU, CHECKED, ("cls", "vllm_config"))


def _apply_cpu() -> None:
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    from vllm.platforms.cpu import CpuPlatform

    original = CpuPlatform.check_and_update_config.__func__

    @functools.wraps(original)
    def check_and_update_config(cls, vllm_config) -> None:
        resolved = vllm_config.scheduler_config.async_scheduling
        original(cls, vllm_config)
        extra = getattr(vllm_config, "additional_config", None) or {}
        if resolved and extra.get(CPU_ASYNC_KEY):
            vllm_config.scheduler_config.async_scheduling = True

    CpuPlatform.check_and_update_config = classmethod(check_and_update_config)


class DasAsyncConfig(Patch, check=_check_config, apply=_apply_config):
    """A DAS engine that asks for async scheduling keeps it (module docstring)."""

    targets = (TARGET_CONFIG, TARGET_GLOBAL)


class CpuAsyncScheduling(Patch, check=_check_cpu, apply=_apply_cpu):
    """The CPU build keeps the async scheduling an engine asks for (module docstring)."""

    targets = (TARGET_CPU,)
