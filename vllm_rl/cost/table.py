"""A step-cost model from a measured table: :class:`TableCost`.

The table holds steps of B sequences each computing q query tokens against L cached ones
(``data/step_cost_h100.json``: Qwen3-8B and Qwen3-1.7B on an H100, bf16, CUDA graphs;
re-measure with ``python -m vllm_rl.cost.measure``).  It is interpolated piecewise-linearly
in log B, q and log L and extrapolated linearly past the grid; monotone by construction.
"""
from __future__ import annotations

import json
import math
import os
from bisect import bisect_right
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from vllm_rl.checks import check_int as _check_int
from vllm_rl.checks import check_real as _check_real
from vllm_rl.cost.base import DEFAULT_SHAPE, TABLES, StepCost


FLOOR_MEMO = 256        # TableCost._floor's answers kept (cleared when full)


def _cummax(values: Iterable[float]) -> list[float]:
    out, top = [], -math.inf
    for v in values:
        top = max(top, v)
        out.append(top)
    return out


def _segment(x: float, knots: Sequence[float]) -> tuple[int, float]:
    """Segment ``s`` and weight ``t`` of ``x`` in ``knots[0] <= x <= knots[-1]`` (2+ knots)."""
    s = min(max(bisect_right(knots, x) - 1, 0), len(knots) - 2)
    return s, (x - knots[s]) / (knots[s + 1] - knots[s])


class _Curve:
    """A non-decreasing function of batch size from values at measured sizes.

    Below the first size: its value.  Between sizes: linear in log2 B.  Past the last:
    linear in B (a saturated GPU is compute-bound; cost grows with tokens) with slope
    ``tail`` (default: the last two knots'; never negative).
    """

    def __init__(self, batches: Sequence[float], values: Sequence[float],
                 tail: float | None = None) -> None:
        self.batches = list(batches)
        self.logs = [math.log2(b) for b in batches]
        self.values = _cummax(values)
        if tail is None:
            tail = (0.0 if len(batches) < 2 else
                    (self.values[-1] - self.values[-2]) / (batches[-1] - batches[-2]))
        self.tail = max(0.0, tail)

    def __call__(self, b: float) -> float:
        if b <= self.batches[0]:
            return self.values[0]
        if b >= self.batches[-1]:
            return self.values[-1] + (b - self.batches[-1]) * self.tail
        s, t = _segment(math.log2(b), self.logs)
        return (1.0 - t) * self.values[s] + t * self.values[s + 1]


class _Surface:
    """A function of (B, q) at one context length, non-decreasing in both.

    ``values[i][j]`` is the step time at ``widths[i]``, ``batches[j]``.  Values are made
    monotone by a cumulative max along q, then along B.  In q: linear between measured
    widths, clamped below the first, linear past the last with the slope of the last two
    widths (per B, itself made non-decreasing in B).  In B: :class:`_Curve`, each width's
    tail slope raised to at least the narrower widths' so the tails stay ordered in q.
    """

    def __init__(self, batches: Sequence[float], widths: Sequence[float],
                 values: Sequence[Sequence[float]]) -> None:
        cols = [_cummax(col) for col in zip(*values)]            # per B, along q
        rows = [_cummax(row) for row in zip(*cols)]              # per q, along B
        tails = _cummax(_Curve(batches, row).tail for row in rows)
        self.widths = list(widths)
        self.rows = [_Curve(batches, row, tail) for row, tail in zip(rows, tails)]
        if len(widths) < 2:
            self.q_slope = _Curve(batches, [0.0] * len(batches), 0.0)
        else:
            dq = widths[-1] - widths[-2]
            self.q_slope = _Curve(batches, [(a - b) / dq for a, b in zip(rows[-1], rows[-2])])
        self._at_b: tuple = (None, [], 0.0)     # (b, each width's value at b, q slope at b)

    def __call__(self, b: float, q: float) -> float:
        return self.many(b, (q,))[0]

    def many(self, b: float, qs: Sequence[float]) -> list[float]:
        """The surface at ``b`` for each of ``qs``, each width's curve evaluated at ``b``
        once."""
        widths = self.widths
        if self._at_b[0] != b:          # a batch cap asks at the same batch step after step
            self._at_b = (b, [row(b) for row in self.rows], self.q_slope(b))
        _, at_b, slope = self._at_b
        out = []
        for q in qs:
            if q <= widths[0]:
                out.append(at_b[0])
            elif q >= widths[-1]:
                out.append(at_b[-1] + (q - widths[-1]) * slope)
            else:
                s, t = _segment(q, widths)
                out.append((1.0 - t) * at_b[s] + t * at_b[s + 1])
        return out


@dataclass(frozen=True)
class Adjustment:
    """A measured grid value raised to keep the table monotone (noise in the measurement)."""

    B: int
    q: int
    L: int
    measured: float
    used: float


class TableCost(StepCost):
    """Step times interpolated from a table of measured steps of one model shape.

    Rows ``{shape, B, q, L, ms}`` (B sequences, q query tokens each, L cached tokens).
    The grid may be ragged in B (the measurement caps B·L); each (B, L) measured must
    have every q.  Interpolation, for B identical sequences:

    * **B**: piecewise-linear in log2 B between measured sizes; past the largest size
      measured *at that L*, linear in B from that L's two largest sizes (a GPU past
      saturation is compute-bound, cost grows linearly in tokens); B < 1 (or below the
      smallest size) costs what the smallest size does.
    * **q**: linear between measured widths; past the widest (9), linear in q from the
      two widest (5 and 9): prefill chunks; q below 1 clamps to 1.
    * **L**: piecewise-linear in log2 L (between the floored per-L functions); below the shortest (256) clamps: short contexts
      cost what 256 does (a step is then dominated by the weights, not the KV); past
      the longest (8192), linear in L from the two longest.

    Monotone (non-decreasing in B, q and L) by construction: measured values get a
    cumulative max along q and B, each L's function is floored by the shorter contexts'
    (a longer context never costs less; this binds only where one side is extrapolated
    in B, e.g. B = 700 at L = 512 against L = 256's log-B interpolation), and the
    extrapolation slopes are floored at 0 and made non-decreasing in B and q.  :attr:`adjustments` lists the measured grid
    values this raised (the H100 table: 10 of 165 at 8B, all at B = 1 or 4 where q = 3
    or 5 measured up to 0.05 ms below a narrower width; none at 1.7B).

    A mixed step costs its mean step (:class:`StepCost`).
    """

    def __init__(self, rows: Iterable[Mapping[str, Any]], shape: str, source: str = "table",
                 label: str | None = None, device: str | None = None) -> None:
        self.shape = shape
        self.source = source
        self.label = label or source
        self.device = device
        self.name = f"{source}:{shape}"
        grid: dict[int, dict[tuple[int, int], float]] = {}    # L -> (B, q) -> ms
        for i, row in enumerate(rows):
            if row.get("shape") != shape:
                continue
            try:
                B, q, L = (_check_int(f"rows[{i}].{k}", row[k], 1) for k in ("B", "q", "L"))
                ms = _check_real(f"rows[{i}].ms", row["ms"], lo=0.0)
            except KeyError as exc:
                raise ValueError(f"rows[{i}] lacks {exc.args[0]!r}") from None
            if (B, q) in grid.setdefault(L, {}):
                raise ValueError(f"duplicate row for {shape} B={B} q={q} L={L}")
            grid[L][B, q] = ms
        if not grid:
            raise ValueError(f"no rows for shape {shape!r}")
        self.contexts = sorted(grid)
        self._log_contexts = [math.log2(L) for L in self.contexts]
        self.widths = sorted({q for cells in grid.values() for _, q in cells})
        self.batches: dict[int, list[int]] = {}
        self._surfaces = []
        self._floors: dict[tuple, tuple[float, ...]] = {}   # _floor's recent answers
        for L in self.contexts:
            batches = sorted({B for B, _ in grid[L]})
            missing = [(B, q) for B in batches for q in self.widths if (B, q) not in grid[L]]
            if missing:
                B, q = missing[0]
                raise ValueError(f"table {shape} L={L}: no row for B={B} q={q} "
                                 f"(each measured (B, L) needs every q of {self.widths})")
            self.batches[L] = batches
            self._surfaces.append(_Surface(
                batches, self.widths, [[grid[L][B, q] for B in batches] for q in self.widths]))
        self._tail = None
        if len(self.contexts) >= 2:                 # slope in L past the longest context
            L1, L2 = self.contexts[-2:]
            batches = self.batches[L2]
            n = len(self.contexts)
            values = [[(self._floor(n - 1, B, (q,))[0] - self._floor(n - 2, B, (q,))[0]) / (L2 - L1)
                       for B in batches] for q in self.widths]
            self._tail = _Surface(batches, self.widths, values)
        self.adjustments = [
            Adjustment(B, q, L, ms, used)
            for L in self.contexts for (B, q), ms in sorted(grid[L].items())
            if abs((used := self.uniform_ms(B, q, L)) - ms) > 1e-9 * ms]

    # ------------------------------------------------------------------ construction

    @classmethod
    def load(cls, path_or_name: str | os.PathLike[str] = "h100",
             shape: str | None = None) -> TableCost:
        """A packaged table by name (``"h100"``) or a table file (JSON: ``{"rows": [...]}``
        or a bare list of rows), for ``shape`` (default ``qwen3-8b``, or the file's only
        shape)."""
        key = str(path_or_name)
        if key.lower() in TABLES:
            path, label = TABLES[key.lower()]
            source = key.lower()
        else:
            path, label, source = Path(key), key, key
            if not path.is_file():
                raise ValueError(f"no step-cost table {key!r}: neither a packaged table "
                                 f"({', '.join(TABLES)}) nor a file")
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"cannot read step-cost table {str(path)!r}: {exc}") from None
        rows = data.get("rows") if isinstance(data, dict) else data
        if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
            raise ValueError(f"step-cost table {str(path)!r} has no list of rows")
        shapes = sorted({str(r.get("shape")) for r in rows})
        if shape is None:
            shape = shapes[0] if len(shapes) == 1 else DEFAULT_SHAPE
        if shape not in shapes:
            raise ValueError(f"step-cost table {key!r} has no shape {shape!r} "
                             f"(it has {', '.join(shapes)})")
        device = data.get("device") if isinstance(data, dict) else None
        return cls(rows, shape, source=source, label=label, device=device)

    # ------------------------------------------------------------------ evaluation

    def _floor(self, k: int, b: float, qs: Sequence[float]) -> tuple[float, ...]:
        """The k-th context's function at each of ``qs``, floored by the shorter ones': a
        longer context never costs less (where the grids are ragged, one side is
        extrapolated).  Remembered by ``(k, b, qs)`` (:data:`FLOOR_MEMO` answers): a
        batch cap asks at the same batch and widths step after step, as contexts grow."""
        key = (k, b, tuple(qs))
        out = self._floors.get(key)
        if out is None:
            if len(self._floors) >= FLOOR_MEMO:
                self._floors.clear()
            out = self._floors[key] = tuple(
                max(col) for col in zip(*(surface.many(b, qs)
                                          for surface in self._surfaces[:k + 1])))
        return out

    def _at(self, b: float, qs: Sequence[float], L: float) -> list[float]:
        """The step time at batch ``b`` and context ``L`` for each width of ``qs``."""
        contexts = self.contexts
        if L <= contexts[0] or len(contexts) == 1:
            return self._surfaces[0].many(b, qs)
        if L >= contexts[-1]:
            base = self._floor(len(contexts) - 1, b, qs)
            tail = self._tail.many(b, qs)
            return [v + (L - contexts[-1]) * d for v, d in zip(base, tail)]
        s, t = _segment(math.log2(L), self._log_contexts)
        lo, hi = self._floor(s, b, qs), self._floor(s + 1, b, qs)
        return [(1.0 - t) * x + t * y for x, y in zip(lo, hi)]

    def width_curve(self, batch: float, widths: Sequence[float],
                    context: float = 256) -> list[float]:
        """:meth:`uniform_ms` at each of ``widths`` (the same values, each batch curve
        evaluated once: the batch caps read this once per step)."""
        batch = _check_real("batch", batch, lo=0.0)
        context = _check_real("context", context, lo=0.0)
        qs = [max(_check_real("width", w, lo=0.0), 1.0) for w in widths]
        if batch <= 0:
            return [0.0] * len(qs)
        return self._at(max(batch, 1.0), qs, context)

    def uniform_ms(self, batch: float, width: float = 1, context: float = 256) -> float:
        batch = _check_real("batch", batch, lo=0.0)
        width = _check_real("width", width, lo=0.0)
        context = _check_real("context", context, lo=0.0)
        if batch <= 0:
            return 0.0
        return self._at(max(batch, 1.0), (max(width, 1.0),), context)[0]

    # ------------------------------------------------------------------ reporting

    def describe(self) -> str:
        device = f" ({self.device})" if self.device else ""
        return f"{self.label} table{device}, {self.shape}, projection"

    def to_dict(self) -> dict[str, Any]:
        return {
            **super().to_dict(), "source": self.source, "shape": self.shape,
            "device": self.device,
            "grid": {"q": self.widths, "L": self.contexts,
                     "B": {str(L): bs for L, bs in self.batches.items()}},
            "adjustments": len(self.adjustments),
        }


__all__ = ["Adjustment", "TableCost"]
