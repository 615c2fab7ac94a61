"""vllm_rl under OpenRLHF: ``python -m vllm_rl.integrations.openrlhf <train_ppo_ray args>``.

OpenRLHF builds its rollout engines in ``openrlhf.trainer.ray.vllm_engine.create_vllm_engines``
as ``RolloutRayActor`` Ray actors.  The launcher (:mod:`.launcher`) replaces that one
module global with :class:`.actor.RLRolloutActor` (the same methods, on the RL engine) and
wraps ``RemoteExperienceMaker.compute_advantages_and_returns`` so that the records reach
the advantages (:mod:`.records`); then it runs OpenRLHF's own ``train_ppo_ray`` with the
command line unchanged.

OpenRLHF's parser rejects unknown flags, so vllm_rl's settings come from the environment:

* ``VLLM_RL_OPENRLHF``: a JSON object, or
* ``VLLM_RL_OPENRLHF_CONFIG``: the path of a JSON (or, with PyYAML installed, YAML) file,

holding the same keys as verl's ``rollout.engine_kwargs.vllm_rl``::

    {"das": true | {DASConfig fields}, "arrol": true | {ArrolConfig fields},
     "cost": ..., "trace": false,
     "flags": {"darts": {"mode": "shortest"}, "duet": {}, "group": {"size": 8}, ...},
     "policy": "pkg.module.RolloutPolicyClass",
     "engine": {vLLM engine keywords that override OpenRLHF's, e.g. "dtype"},
     "partial": true | {PartialConfig fields}}      # partial rollouts (.partial)

The launcher reads them once in the driver and hands them to every rollout actor as a
constructor keyword, so they need not reach the Ray workers' environment.
"""
from __future__ import annotations

import importlib.metadata
import json
import os
from pathlib import Path
from typing import Any

CHECKED = ("0.11.2",)                 # OpenRLHF versions this integration was checked against
ENV_SETTINGS = "VLLM_RL_OPENRLHF"     # JSON settings
ENV_CONFIG = "VLLM_RL_OPENRLHF_CONFIG"  # path of a JSON / YAML settings file
ENV_WORKER = "VLLM_RL_OPENRLHF_WORKER"  # the settings as the driver read them (JSON), in
                                        # the job's Ray workers (the launcher sets it)
SETTINGS_KWARG = "vllm_rl_settings"   # the actor's constructor keyword carrying them
RECORD_KEY = "vllm_rl"                # response dict: the record (RolloutInfo wire string)
FLAGS_KEY = "vllm_rl_flags"           # response dict: the flags the sample ran with (JSON)
HIDDEN_KEY = "vllm_rl_hidden"         # response dict: ARRoL's hidden state at l_detect
                                      # (return_hidden: float32 numpy vector, else None)
ENGINE_SETTINGS = ("das", "arrol", "cost", "trace")
SETTINGS = (*ENGINE_SETTINGS, "flags", "policy", "engine", "partial")
ENGINE_MODULE = "openrlhf.trainer.ray.vllm_engine"
MAKER_MODULE = "openrlhf.trainer.ppo_utils.experience_maker"
TRAIN_MODULE = "openrlhf.cli.train_ppo_ray"


def openrlhf_version() -> str:
    return importlib.metadata.version("openrlhf")


def check_version() -> None:
    """Raise unless the installed OpenRLHF is one this integration was checked against."""
    try:
        found = openrlhf_version()
    except importlib.metadata.PackageNotFoundError:
        raise RuntimeError(f"vllm_rl's OpenRLHF integration needs openrlhf ({CHECKED}); it "
                           f"is not installed: pip install --no-deps "
                           f"openrlhf=={CHECKED[-1]}") from None
    if found not in CHECKED:
        raise RuntimeError(f"vllm_rl's OpenRLHF integration was checked against openrlhf "
                           f"{CHECKED}; found openrlhf {found}. Install openrlhf=={CHECKED[-1]} "
                           f"(pip install --no-deps) or check the integration anew: it replaces "
                           f"{ENGINE_MODULE}.RolloutRayActor and wraps "
                           f"{MAKER_MODULE}.RemoteExperienceMaker.compute_advantages_and_returns.")


def load_settings(environ: dict | None = None) -> dict[str, Any]:
    """The settings from ``VLLM_RL_OPENRLHF`` (JSON) or ``VLLM_RL_OPENRLHF_CONFIG`` (a file)
    (in the launcher's Ray workers: ``VLLM_RL_OPENRLHF_WORKER``, what the driver read); an
    empty dict when none is set.  Both set, or an unknown key: ``ValueError``."""
    env = os.environ if environ is None else environ
    if env.get(ENV_WORKER):               # a Ray worker of the launcher's job
        return check_settings(json.loads(env[ENV_WORKER]), ENV_WORKER)
    raw, path = env.get(ENV_SETTINGS), env.get(ENV_CONFIG)
    if raw and path:
        raise ValueError(f"set {ENV_SETTINGS} or {ENV_CONFIG}, not both")
    if path:
        text = Path(path).read_text()
        if Path(path).suffix in (".yaml", ".yml"):
            import yaml

            settings = yaml.safe_load(text)
        else:
            settings = json.loads(text)
        source = f"{ENV_CONFIG}={path}"
    elif raw:
        settings = json.loads(raw)
        source = ENV_SETTINGS
    else:
        return {}
    return check_settings(settings or {}, source)


def check_settings(settings: Any, source: str = "settings") -> dict[str, Any]:
    """Check the keys and the flags (the engine checks them again per request)."""
    if not isinstance(settings, dict):
        raise ValueError(f"{source}: a JSON object is needed, got {type(settings).__name__}")
    unknown = set(settings) - set(SETTINGS)
    if unknown:
        raise ValueError(f"{source}: unknown keys {sorted(unknown)}; allowed {list(SETTINGS)}")
    if settings.get("engine") is not None and not isinstance(settings["engine"], dict):
        raise ValueError(f"{source}: 'engine' must be an object of vLLM engine keywords")
    from vllm_rl.integrations.common.policy import load_policy

    load_policy(settings)            # bad flags / policy fail here, in the driver
    from vllm_rl.integrations.common.partial import PartialConfig

    PartialConfig.of(settings.get("partial"))      # a bad setting fails here too
    return dict(settings)
