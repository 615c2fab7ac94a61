"""``python -m vllm_rl.integrations.openrlhf <every train_ppo_ray argument>``.

:func:`patch` (after the version check) makes two changes in this process, the driver:

1. ``openrlhf.trainer.ray.vllm_engine.RolloutRayActor`` → :class:`.actor.RLActorClass`
   (``create_vllm_engines`` looks the name up when it runs, so every rollout engine it
   builds is :class:`.actor.RLRolloutActor`, given the settings read here);
2. ``RemoteExperienceMaker.compute_advantages_and_returns`` wrapped by
   :func:`.records.patch_experience_maker` (records into the advantages), when
   ``openrlhf.trainer.ppo_utils.experience_maker`` is imported (it needs DeepSpeed and
   flash-attn, so it is not imported here).

:func:`main` then runs OpenRLHF's own ``openrlhf.cli.train_ppo_ray`` as ``__main__`` with
the arguments unchanged: its parser, its checks, its ``train()``.
"""
from __future__ import annotations

import runpy
import sys
from typing import Sequence

from vllm_rl.integrations.openrlhf import (
    ENGINE_MODULE,
    MAKER_MODULE,
    TRAIN_MODULE,
    check_settings,
    check_version,
    load_settings,
)


def _check_target(vllm_engine) -> None:
    """The patch point still is what was checked: ``create_vllm_engines`` builds
    ``RolloutRayActor`` by its module-global name."""
    names = vllm_engine.create_vllm_engines.__code__.co_names
    if "RolloutRayActor" not in names or not hasattr(vllm_engine, "RolloutRayActor"):
        raise RuntimeError(f"{ENGINE_MODULE}.create_vllm_engines no longer builds "
                           "RolloutRayActor by name: the vllm_rl launcher cannot replace it")


def patch(settings: dict | None = None, experience: bool = True):
    """Replace OpenRLHF's rollout actor (and wrap its advantage computation); returns the
    :class:`.actor.RLActorClass` now in place.  Idempotent."""
    check_version()
    settings = load_settings() if settings is None else check_settings(settings)
    from vllm_rl.compat import vllm_version_shim

    vllm_version_shim()
    from openrlhf.trainer.ray import vllm_engine

    from vllm_rl.integrations.openrlhf.actor import RLActorClass

    _check_target(vllm_engine)
    replaced = RLActorClass(settings)
    vllm_engine.RolloutRayActor = replaced
    if experience:                      # now, or right after train_ppo_ray imports it
        from vllm_rl.integrations.common.hooks import after_import

        after_import(MAKER_MODULE, _wrap_maker)
    return replaced


def _wrap_maker(module) -> None:
    from vllm_rl.integrations.openrlhf.records import patch_experience_maker

    patch_experience_maker(module.RemoteExperienceMaker)


def main(argv: Sequence[str] | None = None) -> int:
    """Patch, then run ``openrlhf.cli.train_ppo_ray`` with ``argv`` (default: this
    process's arguments).  Returns 0, or the ``SystemExit`` code of OpenRLHF's parser."""
    argv = list(sys.argv[1:] if argv is None else argv)
    patch()
    saved = sys.argv
    sys.argv = [TRAIN_MODULE.replace(".", "/") + ".py", *argv]
    try:
        runpy.run_module(TRAIN_MODULE, run_name="__main__", alter_sys=False)
    except SystemExit as e:             # argparse's --help and errors
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        sys.argv = saved
    return 0
