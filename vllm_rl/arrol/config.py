"""ARRoL engine settings, submission checks and the model-runner check."""
from __future__ import annotations

import contextlib
import json
import os
from dataclasses import asdict, dataclass
from typing import Any

from vllm_rl.class_paths import WORKER_EXTENSION_CLS
from vllm_rl.flags import FlagError, RLFlags


def load_head_state(head: Any) -> dict:
    """A head state from a dict or the path of a JSON file holding one."""
    if isinstance(head, (str, bytes)) or hasattr(head, "__fspath__"):
        with open(head) as f:
            return json.load(f)
    if not isinstance(head, dict):
        raise ValueError("ARRoL head: a state dict (QualityHead.export) or a JSON path")
    return head


CONFIG_KEY = "vllm_rl_arrol"          # additional_config key of an ARRoL engine
RUNNER_ENV = "VLLM_USE_V2_MODEL_RUNNER"


@dataclass(frozen=True)
class ArrolConfig:
    """The quality head an ARRoL engine starts with (Sec. 4.2, App. A.4).

    ``head``: the head's state as :meth:`vllm_rl.arrol.head.QualityHead.export`
    writes it (a dict, or the path of a JSON file holding one); left out, the engine
    starts with a head initialised from ``seed`` (``width`` hidden units, ``activation``)
    — the untrained head of a trainer's first step.  ``calibration``: a
    :class:`vllm_rl.arrol.rule.Calibration` as a dict; left out, the engine
    is in its cold start: samples are scored and recorded, never pruned (the paper's
    first 20 steps), until the trainer pushes one with ``arrol_update``.
    """

    head: Any = None
    calibration: dict | None = None
    width: int = 128
    activation: str = "relu"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.activation not in ("relu", "gelu"):
            raise ValueError(f"ArrolConfig.activation={self.activation!r}: allowed 'relu', 'gelu'")
        if not 1 <= self.width <= 4096:
            raise ValueError(f"ArrolConfig.width={self.width}: allowed int in [1, 4096]")
        if self.calibration is not None:
            from vllm_rl.arrol.rule import Calibration

            Calibration.from_dict(self.calibration)      # a bad one fails at start

    @classmethod
    def of(cls, value: "ArrolConfig | dict | bool") -> "ArrolConfig":
        from vllm_rl.checks import settings_of

        return settings_of(cls, value, "arrol")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        head = d["head"]
        if head is not None and not isinstance(head, (str, dict)):
            raise TypeError("ArrolConfig.head: a state dict (QualityHead.export) or a JSON path")
        return d

    @classmethod
    def from_vllm_config(cls, vllm_config: Any) -> "ArrolConfig | None":
        extra = getattr(vllm_config, "additional_config", None) or {}
        value = extra.get(CONFIG_KEY)
        return None if value is None else cls.of(dict(value))

    def engine_kwargs(self) -> dict[str, Any]:
        return {"additional_config": {CONFIG_KEY: self.to_dict()},
                "worker_extension_cls": WORKER_EXTENSION_CLS}


def use_v1_runner() -> None:
    """Select vLLM's V1 model runner for engines started from now on in this process
    (and the processes it spawns): the runner ``patches/model_runner/arrol_capture.py`` patches."""
    os.environ[RUNNER_ENV] = "0"


@contextlib.contextmanager
def v1_runner_env():
    """:func:`use_v1_runner` while an engine starts, the environment restored after."""
    old = os.environ.get(RUNNER_ENV)
    os.environ[RUNNER_ENV] = "0"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(RUNNER_ENV, None)
        else:
            os.environ[RUNNER_ENV] = old


def check_runner(vllm_config: Any) -> None:
    """Refuse to start an ARRoL engine on a model runner the capture patch does not
    serve (Model Runner V2): it would score nothing, silently."""
    if CONFIG_KEY not in (getattr(vllm_config, "additional_config", None) or {}):
        return
    if getattr(vllm_config, "use_v2_model_runner", False):
        raise RuntimeError(
            "ARRoL needs vLLM's V1 model runner (patches/model_runner/arrol_capture.py patches "
            "GPUModelRunner.sample_tokens), but this engine runs Model Runner V2; start it "
            f"with {RUNNER_ENV}=0 (vllm_rl.LLM(arrol=...) and vllm_rl.serve set it)")


def check_engine(flags: RLFlags | None, vllm_config: Any) -> RLFlags | None:
    """Reject, at submission, ARRoL flags on an engine without a quality head."""
    if flags is None or flags.arrol is None:
        return flags
    if CONFIG_KEY not in (getattr(vllm_config, "additional_config", None) or {}):
        raise FlagError("arrol", "this engine was started without an ARRoL quality head",
                        "an engine started with vllm_rl.LLM(arrol=...), "
                        "engine_args(arrol=...) or vllm_rl.serve --arrol")
    return flags


def check_update(head: Any = None, calibration: Any = None, cold_start: Any = False,
                 version: Any = None, vllm_config: Any = None) -> dict[str, Any]:
    """An ``arrol_update``'s arguments checked before they reach a worker, prepared as
    the worker takes them: a head path loaded into its state, a ``Calibration`` as its
    dict.  With ``vllm_config`` (the engine's), also that the engine has a head and that
    the head's ``hidden_size`` is the model's.  Raises ``ValueError`` naming the key and
    what is allowed; the worker checks the same again (:meth:`HeadScorer.update`), so a
    bad update never swaps half a head.  Called by every path in: ``vllm_rl.LLM``, the
    actors' RPCs and ``POST /vllm_rl/arrol`` (:data:`vllm_rl.rpc.METHODS`)."""
    if not isinstance(cold_start, bool) and cold_start not in (0, 1):
        raise ValueError(f"arrol_update: cold_start={cold_start!r}: allowed a bool")
    cold_start = bool(cold_start)
    if version is not None and (isinstance(version, bool) or not isinstance(version, int)
                                or version < 0):
        raise ValueError(f"arrol_update: version={version!r}: allowed an int >= 0 or None "
                         "(the current version + 1)")
    if cold_start and calibration is not None:
        raise ValueError("arrol_update: cold_start=True and a calibration together: "
                         "allowed one of them")
    if calibration is not None:
        from vllm_rl.arrol.rule import Calibration

        if isinstance(calibration, Calibration):
            calibration = calibration.to_dict()
        Calibration.from_dict(calibration)            # raises naming the bad key
    hidden_size = None
    if vllm_config is not None:
        if CONFIG_KEY not in (getattr(vllm_config, "additional_config", None) or {}):
            raise ValueError("arrol_update: this engine was started without an ARRoL "
                             "quality head (vllm_rl.LLM(arrol=...), engine_args(arrol=...) "
                             "or vllm_rl.serve --arrol)")
        model_config = getattr(vllm_config, "model_config", None)
        if model_config is not None:
            hidden_size = model_config.get_hidden_size()
    if head is not None:
        from vllm_rl.arrol.head import check_head_state

        try:
            head = load_head_state(head)
        except OSError as e:
            raise ValueError(f"arrol_update: head file: {e}") from None
        except json.JSONDecodeError as e:
            raise ValueError(f"arrol_update: head file is not JSON ({e})") from None
        check_head_state(head, hidden_size=hidden_size)
    return {"head": head, "calibration": calibration, "cold_start": cold_start,
            "version": version}


__all__ = ["ArrolConfig", "check_engine", "check_runner", "check_update", "use_v1_runner",
           "v1_runner_env"]
