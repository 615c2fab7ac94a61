"""Argument checks shared by the controllers: a bad argument raises ValueError naming it."""
from __future__ import annotations

import math
import numbers
from typing import Any, Sequence


def check_int(name: str, value: Any, lo: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an int, got {type(value).__name__}")
    if value < lo:
        raise ValueError(f"{name} must be >= {lo}, got {value}")
    return int(value)


def check_real(name: str, value: Any, lo: float | None = None, strict: bool = False) -> float:
    if (isinstance(value, bool) or not isinstance(value, numbers.Real)
            or not math.isfinite(value)):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    if lo is not None and (value <= lo if strict else value < lo):
        raise ValueError(f"{name} must be {'>' if strict else '>='} {lo}, got {value}")
    return float(value)


def check_lengths(name: str, values: Any) -> list[float]:
    """Each of ``values`` a finite number >= 0 (a length, in tokens), as floats."""
    values = list(values)
    for i, v in enumerate(values):
        check_real(f"{name}[{i}]", v, lo=0.0)
    return [float(v) for v in values]


def check_same_length(**seqs: Sequence[Any]) -> int:
    """The common length of the named sequences (ValueError naming the odd one)."""
    sizes = {name: len(seq) for name, seq in seqs.items()}
    first, n = next(iter(sizes.items()))
    for name, size in sizes.items():
        if size != n:
            raise ValueError(f"{name} must have the same length as {first} ({n}), got {size}")
    return n


def settings_of(cls: type, value: Any, keyword: str) -> Any:
    """An engine-settings dataclass from what ``LLM(keyword=...)`` was given: an instance,
    ``True`` (the defaults) or a dict of its fields (unknown keys raise ValueError)."""
    from dataclasses import fields

    if isinstance(value, cls):
        return value
    if value is True:
        return cls()
    if isinstance(value, dict):
        known = {f.name for f in fields(cls)}
        unknown = set(value) - known
        if unknown:
            raise ValueError(f"unknown {keyword}= settings {sorted(unknown)}; "
                             f"known: {sorted(known)}")
        return cls(**value)
    raise TypeError(f"{keyword}= takes True, a dict or a {cls.__name__}, not {value!r}")


def is_int(value: Any) -> bool:
    """An integer, not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_unit(name: str, value: Any, open_low: bool = False) -> float:
    """A real number in [0, 1] (a probability or a rate; in (0, 1] with ``open_low``), as a
    float."""
    ok = not isinstance(value, bool) and isinstance(value, numbers.Real) and (
        0.0 < value <= 1.0 if open_low else 0.0 <= value <= 1.0)
    if not ok:
        raise ValueError(f"{name}={value!r}: allowed a float in {'(0' if open_low else '[0'}, 1]")
    return float(value)
