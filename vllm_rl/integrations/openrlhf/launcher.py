"""``python -m vllm_rl.integrations.openrlhf <every train_ppo_ray argument>``.

:func:`patch` (after the version check) makes its changes in this process, the driver:

1. ``openrlhf.trainer.ray.vllm_engine.RolloutRayActor`` → :class:`.actor.RLActorClass`
   (``create_vllm_engines`` looks the name up when it runs, so every rollout engine it
   builds is :class:`.actor.RLRolloutActor`, given the settings read here);
2. :func:`setup_worker`'s changes, for a trainer run in this process;
3. ``ray.init`` (which ``train_ppo_ray`` calls) given the job's
   ``worker_process_setup_hook``: :func:`setup_worker` runs in every Ray worker the job
   starts, with the settings read here.  OpenRLHF's ``PPOTrainer`` is a Ray actor, so
   what it imports is imported in a worker, never in the driver.

:func:`setup_worker` (in the driver and in every worker) changes OpenRLHF's trainer side
when its modules are imported (they need DeepSpeed and flash-attn, so nothing imports
them here):

* ``RemoteExperienceMaker.compute_advantages_and_returns`` wrapped by
  :func:`.records.patch_experience_maker` (records into the advantages);
* with ``partial`` in the settings, ``openrlhf.trainer.ppo_trainer.SamplesGenerator`` →
  :class:`.partial.RLSamplesGenerator` (``PPOTrainer.__init__`` looks the name up when it
  runs), and ``BasePPOTrainer.save_logs_and_checkpoints`` / ``init_checkpoint_states``
  keep the carried samples in OpenRLHF's checkpoint (``client_states``).

:func:`main` then runs OpenRLHF's own ``openrlhf.cli.train_ppo_ray`` as ``__main__`` with
the arguments unchanged: its parser, its checks, its ``train()``.
"""
from __future__ import annotations

import functools
import json
import runpy
import sys
from typing import Sequence

from vllm_rl.integrations.openrlhf import (
    ENGINE_MODULE,
    ENV_WORKER,
    MAKER_MODULE,
    TRAIN_MODULE,
    check_settings,
    check_version,
    load_settings,
)

TRAINER_MODULE = "openrlhf.trainer.ppo_trainer"
SETUP_HOOK = f"{__name__}.setup_worker"       # the job's worker_process_setup_hook
CHECKPOINT_KEY = "vllm_rl_partial"            # client_states: the carried samples


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
        setup_worker(settings)
    return replaced


def setup_worker(settings: dict | None = None) -> None:
    """OpenRLHF's trainer side on the RL engine's records (module docstring), in this
    process: the job's ``worker_process_setup_hook`` (settings from ``ENV_WORKER``)."""
    from vllm_rl.integrations.common.hooks import after_import

    if settings is None:
        settings = load_settings()
    after_import(MAKER_MODULE, _wrap_maker)
    if settings.get("partial"):
        after_import(TRAINER_MODULE, _use_partial)


def _wrap_maker(module) -> None:
    from vllm_rl.integrations.openrlhf.records import patch_experience_maker

    patch_experience_maker(module.RemoteExperienceMaker)


def _use_partial(module) -> None:
    """``SamplesGenerator`` → :class:`.partial.RLSamplesGenerator`, its buffer in the
    trainer's checkpoint."""
    from vllm_rl.integrations.openrlhf.partial import RLSamplesGenerator

    if "SamplesGenerator" not in module.PPOTrainer.__ray_actor_class__.__init__.__code__.co_names:
        raise RuntimeError(f"{TRAINER_MODULE}.PPOTrainer no longer builds SamplesGenerator "
                           "by name: vllm_rl's partial rollouts cannot replace it")
    module.SamplesGenerator = RLSamplesGenerator
    base = module.BasePPOTrainer
    save, init = base.save_logs_and_checkpoints, base.init_checkpoint_states
    if getattr(save, "__vllm_rl_wrapped__", False):
        return

    @functools.wraps(save)
    def save_logs_and_checkpoints(self, global_step, logs_dict=None, client_states=None):
        generator = getattr(self, "samples_generator", None)
        if isinstance(generator, RLSamplesGenerator):
            client_states = dict(client_states or {})
            client_states[CHECKPOINT_KEY] = generator.state_dict()
        return save(self, global_step, logs_dict, client_states)

    @functools.wraps(init)
    def init_checkpoint_states(self):
        states = init(self)
        generator = getattr(self, "samples_generator", None)
        if isinstance(generator, RLSamplesGenerator) and states.get(CHECKPOINT_KEY):
            generator.load_state_dict(states[CHECKPOINT_KEY])
        return states

    save_logs_and_checkpoints.__vllm_rl_wrapped__ = True
    base.save_logs_and_checkpoints = save_logs_and_checkpoints
    base.init_checkpoint_states = init_checkpoint_states


def ray_init(settings: dict):
    """``ray.init`` with the job's ``worker_process_setup_hook`` (:func:`setup_worker`)
    and the settings in its environment; a hook of the caller's own is refused."""
    import ray

    original = ray.init

    @functools.wraps(original)
    def init(*args, runtime_env: dict | None = None, **kwargs):
        env = dict(runtime_env or {})
        if env.get("worker_process_setup_hook") not in (None, SETUP_HOOK):
            raise ValueError(f"runtime_env.worker_process_setup_hook="
                             f"{env['worker_process_setup_hook']!r}: vllm_rl sets its own")
        env["worker_process_setup_hook"] = SETUP_HOOK
        env["env_vars"] = {**(env.get("env_vars") or {}), ENV_WORKER: json.dumps(settings)}
        return original(*args, runtime_env=env, **kwargs)

    return init


def main(argv: Sequence[str] | None = None) -> int:
    """Patch, then run ``openrlhf.cli.train_ppo_ray`` with ``argv`` (default: this
    process's arguments).  Returns 0, or the ``SystemExit`` code of OpenRLHF's parser."""
    import ray

    argv = list(sys.argv[1:] if argv is None else argv)
    replaced = patch()
    saved, saved_init = sys.argv, ray.init
    sys.argv = [TRAIN_MODULE.replace(".", "/") + ".py", *argv]
    ray.init = ray_init(replaced.settings)
    try:
        runpy.run_module(TRAIN_MODULE, run_name="__main__", alter_sys=False)
    except SystemExit as e:             # argparse's --help and errors
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        sys.argv, ray.init = saved, saved_init
    return 0
