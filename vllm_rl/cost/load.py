"""Build a step-cost model from a spec: :func:`load_cost`.

Specs: ``None`` or ``"online"`` (:class:`~vllm_rl.cost.online.OnlineCost`), ``"h100"`` or
``"h100:<shape>"`` (the packaged H100 table, :class:`~vllm_rl.cost.table.TableCost`),
``"path/table.json[:shape]"``, ``{"table": ..., "shape": ...}``, or a
:class:`~vllm_rl.cost.base.StepCost` instance.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from vllm_rl.cost.base import SPEC_FORMS, TABLES, StepCost
from vllm_rl.cost.online import OnlineCost
from vllm_rl.cost.table import TableCost


def _table_spec(spec: str) -> tuple[str, str | None]:
    """Split ``name[:shape]`` / ``path.json[:shape]`` (a path may itself contain ':')."""
    if spec.lower() in TABLES or Path(spec).is_file() or ":" not in spec:
        return spec, None
    table, shape = spec.rsplit(":", 1)
    return table, shape or None


def load_cost(spec: StepCost | str | os.PathLike[str] | Mapping[str, Any] | None) -> StepCost:
    """A step-cost model from a spec: see :data:`SPEC_FORMS`.  ValueError if bad."""
    if spec is None:
        return OnlineCost()
    if isinstance(spec, StepCost):
        return spec
    if isinstance(spec, Mapping):
        extra = set(spec) - {"table", "shape"}
        if extra or not isinstance(spec.get("table", "h100"), (str, os.PathLike)):
            raise ValueError(f"bad step-cost spec {dict(spec)!r}; allowed: {SPEC_FORMS}")
        table, shape = spec.get("table", "h100"), spec.get("shape")
    elif isinstance(spec, (str, os.PathLike)):
        text = str(spec).strip()
        if text.lower() == "online":
            return OnlineCost()
        table, shape = _table_spec(text)
        if table.lower() not in TABLES and not (table.endswith(".json")
                                                or Path(table).is_file()):
            raise ValueError(f"bad step-cost spec {text!r}; allowed: {SPEC_FORMS}")
    else:
        raise ValueError(f"bad step-cost spec of type {type(spec).__name__}; "
                         f"allowed: {SPEC_FORMS}")
    try:
        return TableCost.load(table, shape)
    except ValueError as exc:
        raise ValueError(f"{exc}; allowed: {SPEC_FORMS}") from None


__all__ = ["load_cost"]
