"""The quality head as the worker serves it: one immutable :class:`Head` (the weights on
the runner's device and the calibration of App. A.4), built from a checked state and
replaced whole between steps (``arrol_update``), so a step never sees half of one.  The
head's function, Eq. 1's score s(h) = w2 · act(W1 h + b1 [+ W1f f]) + b2, is computed by
:func:`vllm_rl.kernels.score_rows`; the trainer side is :mod:`vllm_rl.arrol.head`.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

from vllm_rl.arrol import rule
from vllm_rl.arrol.config import ArrolConfig, load_head_state


@dataclass(frozen=True)
class Head:
    """One immutable head + calibration; replaced whole by an update, so a step never
    sees half of one (``version`` names it in every record)."""

    w1: torch.Tensor
    b1: torch.Tensor
    w2: torch.Tensor
    b2: torch.Tensor
    activation: str
    calibration: rule.Calibration | None
    version: int
    w1f: torch.Tensor | None = None      # [D, F]: a head that reads the trace features


def _tensor(x: Any, shape: tuple[int, ...], name: str, device, dtype=torch.float32):
    t = torch.as_tensor(x, dtype=dtype)
    if tuple(t.shape) != shape:
        raise ValueError(f"ARRoL head '{name}': shape {tuple(t.shape)}, expected {shape}")
    if not torch.isfinite(t).all():
        raise ValueError(f"ARRoL head '{name}': non-finite values")
    return t.to(device)


def calibration_of(value: Any) -> rule.Calibration | None:
    """A :class:`Calibration` from itself, its dict, or None."""
    if value is None or isinstance(value, rule.Calibration):
        return value
    return rule.Calibration.from_dict(value)


def build_head(state: dict, version: int, hidden_size: int, device) -> Head:
    """Checked weights on the runner's device, no calibration (between steps)."""
    from vllm_rl.arrol.head import check_head_state

    check_head_state(state, hidden_size=hidden_size)
    width = int(state["width"])
    w1f = None
    if state.get("w1f") is not None:
        w1f = _tensor(state["w1f"], (width, len(rule.TRACE_FEATURES)), "w1f", device)
    return Head(
        w1=_tensor(state["w1"], (width, hidden_size), "w1", device),
        b1=_tensor(state["b1"], (width,), "b1", device),
        w2=_tensor(state["w2"], (width,), "w2", device),
        b2=_tensor(state["b2"], (), "b2", device),
        activation=state["activation"], calibration=None, version=version, w1f=w1f)


def initial_head(cfg: ArrolConfig, hidden_size: int, device) -> Head:
    """The engine's first head: ``cfg.head`` (a state or its file), or a fresh
    :class:`~vllm_rl.arrol.head.QualityHead` from ``cfg.seed``; with ``cfg.calibration``."""
    if cfg.head is not None:
        state = load_head_state(cfg.head)
    else:
        from vllm_rl.arrol.head import QualityHead

        torch.manual_seed(cfg.seed)
        state = QualityHead(hidden_size, cfg.width, cfg.activation).export(0)
    return replace(build_head(state, int(state.get("version", 0)), hidden_size, device),
                   calibration=calibration_of(cfg.calibration))


def updated_head(cur: Head, hidden_size: int, device, head: Any = None,
                 calibration: Any = None, cold_start: bool = False,
                 version: int | None = None) -> Head:
    """``cur`` with its weights and/or calibration replaced (``arrol_update``).

    ``head=None`` keeps the weights, ``calibration=None`` keeps the calibration,
    ``cold_start=True`` drops it (score only); the version is ``version`` or the next.
    Everything is checked before anything is built: a bad update raises, and the caller
    keeps serving ``cur``."""
    if cold_start and calibration is not None:
        raise ValueError("arrol_update: cold_start=True and a calibration together")
    new_version = cur.version + 1 if version is None else int(version)
    weights = cur if head is None else build_head(load_head_state(head), new_version,
                                                  hidden_size, device)
    cal = None if cold_start else (
        cur.calibration if calibration is None else calibration_of(calibration))
    return replace(weights, calibration=cal, version=new_version)


__all__ = ["Head", "build_head", "calibration_of", "initial_head", "updated_head"]
