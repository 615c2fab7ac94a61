"""Step-cost models: the time of one engine step, from a measured table or fitted online.

A step is a list of sequences; sequence i computes ``widths[i]`` query tokens (1: plain
decode; 1 + k: verifying k draft tokens; more: a prefill chunk) against ``contexts[i]``
tokens already cached before the step.  Every model answers :meth:`StepCost.step_ms`,
and from it the planning views the controllers use: :meth:`StepCost.uniform_ms` (B
identical sequences), :meth:`StepCost.ptl` (DARTS' PTL(B), App. A / Eq. 4) and
:meth:`StepCost.verify_extra_ms` (DAS' marginal cost of drafting width).

* :class:`TableCost` interpolates a table of measured steps (``step_cost_h100.json``:
  Qwen3-8B and Qwen3-1.7B on an H100, bf16, CUDA graphs; re-measure with
  ``python -m vllm_rl.cost.measure``).
* :class:`OnlineCost` fits ``ms ≈ a + b·T + c·A`` to the steps the running engine
  reports (T tokens computed, A attention work), with a prior until it has data.
* :func:`load_cost` builds either from a spec; :func:`project` costs a trace of steps.

Pure Python (stdlib only, no torch): the scheduler and the workers import it cheaply.
"""
from __future__ import annotations

import abc
import json
import math
import os
from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import combinations
from pathlib import Path
from typing import Any

from vllm_rl.control.checks import check_int as _check_int
from vllm_rl.control.checks import check_real as _check_real
from vllm_rl.control.checks import check_same_length as _check_same_length

__all__ = [
    "DATA_DIR", "TABLES", "OnlineCost", "Projection", "StepCost", "TableCost",
    "load_cost", "project",
]

DATA_DIR = Path(__file__).resolve().parent / "data"
#: Packaged tables by name (``load_cost("h100")``): name -> (file, label).
TABLES: dict[str, tuple[Path, str]] = {
    "h100": (DATA_DIR / "step_cost_h100.json", "H100"),
}
DEFAULT_SHAPE = "qwen3-8b"

SPEC_FORMS = ("None or 'online' (OnlineCost); 'h100' or 'h100:<shape>' (packaged H100 "
              "table, shapes qwen3-8b [default], qwen3-1.7b); 'path/to/table.json' or "
              "'path/to/table.json:<shape>'; a dict {'table': <name or path>, "
              "'shape': <shape>}; or a StepCost instance")


# ------------------------------------------------------------------------ input checks


def _step_sums(widths: Sequence[int], contexts: Sequence[int]) -> tuple[int, int, int, int]:
    """``(n, T, C, A)`` of a step over its sequences of non-zero width (a width-0 sequence
    computes nothing): their count, Σ wᵢ, Σ cᵢ and Σ wᵢ·(cᵢ + wᵢ)."""
    _check_same_length(widths=widths, contexts=contexts)
    if not (all(type(w) is int and w >= 0 for w in widths)
            and all(type(c) is int and c >= 0 for c in contexts)):
        for i, (w, c) in enumerate(zip(widths, contexts)):     # names the bad entry
            _check_int(f"widths[{i}]", w, 0)
            _check_int(f"contexts[{i}]", c, 0)
        widths, contexts = [int(w) for w in widths], [int(c) for c in contexts]
    n = T = C = A = 0
    for w, c in zip(widths, contexts):
        if w:
            n += 1
            T += w
            C += c
            A += w * (c + w)
    return n, T, C, A


# -------------------------------------------------------------------------- base class


class StepCost(abc.ABC):
    """The time (ms) of one engine step; subclasses implement :meth:`uniform_ms`.

    The base :meth:`step_ms` maps a mixed step to B identical sequences of the mean
    width and mean context: the linear layers (QKV, O, MLP, LM head: the bulk of the
    FLOPs and, at small batch, of the weight reads) scale with the total tokens
    Σ widths = B · mean width, and attention's KV reads scale with the total context
    Σ contexts = B · mean context, so the mean step does the same work.  (Attention's
    FLOPs Σ wᵢ·cᵢ are approximated by B · w̄ · c̄, exact when widths or contexts are
    equal, e.g. a decode step.)  A few prefill chunks in a decode batch raise the mean
    width past the measured range; the model then extrapolates linearly in width,
    i.e. in tokens, which is how a compute-bound step grows.
    """

    name: str = "step-cost"

    @abc.abstractmethod
    def uniform_ms(self, batch: float, width: float = 1, context: float = 256) -> float:
        """One step of ``batch`` identical sequences (``width`` query tokens each,
        ``context`` tokens cached).  ``batch == 0`` is an empty step: 0."""

    def step_ms(self, widths: Sequence[int], contexts: Sequence[int]) -> float:
        """One step in which sequence i computes ``widths[i]`` query tokens against
        ``contexts[i]`` cached tokens (see the class docstring).  Empty step: 0."""
        n, T, C, _ = _step_sums(widths, contexts)
        return self.uniform_ms(n, T / n, C / n) if n else 0.0

    def ptl(self, context: float = 256) -> Callable[[int], float]:
        """PTL(B) of DARTS (App. A, Eq. 4): the time of a decode step at batch B.

        Usable wherever :class:`vllm_rl.control.darts.PTLCurve` is (``rollout_cost``,
        ``cost_slope``).
        """
        context = _check_real("context", context, lo=0.0)
        return lambda b: self.uniform_ms(b, 1, context)

    def verify_extra_ms(self, batch: float, width: float, context: float = 256) -> float:
        """The marginal cost of widening every sequence of a ``batch`` step from 1 to
        ``width`` query tokens (verifying ``width - 1`` drafts): for DAS budget policies."""
        return self.uniform_ms(batch, width, context) - self.uniform_ms(batch, 1, context)

    def linear_at(self, batch: float, context: float = 256) -> tuple[float, float]:
        """Eq. 1 of DAS, ``c_base + c_tok · n_toks``, as the tangent of this model at a
        decode step of ``batch`` sequences: ``c_tok`` is the cost of one more query token
        per sequence spread over the batch's tokens, ``(T(B, q=2) − T(B, q=1)) / B``, and
        ``c_base = T(B, 1) − c_tok · B`` (at least 0).  This is what Eq. 7's budgets need:
        the price of a verified draft token against the price of a pass, at the batch the
        engine runs now.  ``c_tok`` is at least 1e-6 ms."""
        batch = max(1.0, _check_real("batch", batch, lo=0.0))
        one = self.uniform_ms(batch, 1, context)
        c_tok = max(1e-6, (self.uniform_ms(batch, 2, context) - one) / batch)
        return max(0.0, one - c_tok * batch), c_tok

    def describe(self) -> str:
        """One line naming the model and its source."""
        return self.name

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able summary (for logs and run records)."""
        return {"kind": type(self).__name__, "name": self.name, "describe": self.describe()}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.describe()!r})"


# ------------------------------------------------------------------- table interpolation


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

    def __call__(self, b: float, q: float) -> float:
        widths = self.widths
        if q <= widths[0]:
            return self.rows[0](b)
        if q >= widths[-1]:
            return self.rows[-1](b) + (q - widths[-1]) * self.q_slope(b)
        s, t = _segment(q, widths)
        return (1.0 - t) * self.rows[s](b) + t * self.rows[s + 1](b)


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
            values = [[(self._floor(n - 1, B, q) - self._floor(n - 2, B, q)) / (L2 - L1)
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

    def _floor(self, k: int, b: float, q: float) -> float:
        """The k-th context's function floored by the shorter ones': a longer context
        never costs less (where the grids are ragged, one side is extrapolated)."""
        return max(surface(b, q) for surface in self._surfaces[:k + 1])

    def _at(self, b: float, q: float, L: float) -> float:
        contexts = self.contexts
        if L <= contexts[0] or len(contexts) == 1:
            return self._surfaces[0](b, q)
        if L >= contexts[-1]:
            base = self._floor(len(contexts) - 1, b, q)
            return base + (L - contexts[-1]) * self._tail(b, q)
        s, t = _segment(math.log2(L), self._log_contexts)
        return (1.0 - t) * self._floor(s, b, q) + t * self._floor(s + 1, b, q)

    def uniform_ms(self, batch: float, width: float = 1, context: float = 256) -> float:
        batch = _check_real("batch", batch, lo=0.0)
        width = _check_real("width", width, lo=0.0)
        context = _check_real("context", context, lo=0.0)
        if batch <= 0:
            return 0.0
        return self._at(max(batch, 1.0), max(width, 1.0), context)

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


# ---------------------------------------------------------------------- online fit

#: OnlineCost's default before it has data and without a prior: token-proportional,
#: ms = DEFAULT_BASE_MS + DEFAULT_TOKEN_MS · tokens.  A rounded least-squares fit of
#: Qwen3-8B on one H100 (the packaged table: ≈7.4 ms + 0.027 ms/token, ±3 ms).
DEFAULT_BASE_MS = 7.0
DEFAULT_TOKEN_MS = 0.027


def _solve(matrix: list[list[float]], rhs: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting; ``None`` if (near) singular."""
    n = len(rhs)
    m = [row[:] + [r] for row, r in zip(matrix, rhs)]
    scale = max((abs(v) for row in matrix for v in row), default=0.0)
    for col in range(n):
        piv = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[piv][col]) <= 1e-10 * scale:
            return None
        m[col], m[piv] = m[piv], m[col]
        for r in range(col + 1, n):
            f = m[r][col] / m[col][col]
            for c in range(col, n + 1):
                m[r][c] -= f * m[col][c]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        x[r] = (m[r][n] - sum(m[r][c] * x[c] for c in range(r + 1, n))) / m[r][r]
    return x


def _nnls(rows: Sequence[Sequence[float]], ys: Sequence[float]) -> tuple[float, ...]:
    """Non-negative least squares for a few unknowns, exactly.

    The optimum is the unconstrained least-squares fit on some subset of the columns
    with the others at 0 (what clipping negative coefficients to 0 and refitting the
    rest aims at), so every subset is solved from the Gram matrix and the non-negative
    fit with the smallest residual is kept.  Columns are scaled to unit RMS first (the
    attention work A is ~10⁶ times the token count T).
    """
    k, n = len(rows[0]), len(rows)
    scale = [math.sqrt(math.fsum(r[j] ** 2 for r in rows) / n) or 1.0 for j in range(k)]
    xs = [[r[j] / scale[j] for j in range(k)] for r in rows]
    gram = [[math.fsum(x[i] * x[j] for x in xs) for j in range(k)] for i in range(k)]
    xty = [math.fsum(x[i] * y for x, y in zip(xs, ys)) for i in range(k)]
    yy = math.fsum(y * y for y in ys)
    best, best_rss = [0.0] * k, yy
    for size in range(1, k + 1):
        for cols in combinations(range(k), size):
            sol = _solve([[gram[i][j] for j in cols] for i in cols], [xty[i] for i in cols])
            if sol is None or min(sol) < 0:
                continue
            # RSS = yᵀy − 2βᵀXᵀy + βᵀGβ; at the subset's optimum Gβ = Xᵀy: yᵀy − βᵀXᵀy.
            rss = yy - math.fsum(v * xty[c] for c, v in zip(cols, sol))
            if rss < best_rss - 1e-12 * abs(best_rss):
                best = [0.0] * k
                for c, v in zip(cols, sol):
                    best[c] = v
                best_rss = rss
    return tuple(c / s for c, s in zip(best, scale))


class OnlineCost(StepCost):
    """Step time fitted online to the engine's measured steps.

    ``ms ≈ a + b·T + c·A`` with T = Σ wᵢ (tokens computed: the linear layers) and
    A = Σ wᵢ·(cᵢ + wᵢ) (query-key pairs: attention), all coefficients ≥ 0: the DAS
    latency model t_fwd = c_base + c_tok·n_toks (Eq. 1) with an attention term.  Fitted
    by exact non-negative least squares over the last ``window`` steps,
    lazily: when asked, if ``refit_every`` steps arrived since the last fit.  With fewer
    than ``min_observations`` steps it answers with ``prior`` (if given), else with
    ``DEFAULT_BASE_MS + DEFAULT_TOKEN_MS · T``.

    :meth:`step_ms` uses T and A exactly (no mean mapping); :meth:`uniform_ms` is the
    same formula for B identical sequences.
    """

    name = "online"

    def __init__(self, prior: StepCost | None = None, window: int = 512,
                 refit_every: int = 32, min_observations: int = 16) -> None:
        if prior is not None and not isinstance(prior, StepCost):
            raise ValueError(f"prior must be a StepCost or None, got {type(prior).__name__}")
        self.prior = prior
        self.window = _check_int("window", window, 1)
        self.refit_every = _check_int("refit_every", refit_every, 1)
        self.min_observations = _check_int("min_observations", min_observations, 1)
        self._obs: deque[tuple[float, float, float]] = deque(maxlen=self.window)
        self._since = 0               # observations since the last fit
        self._total = 0
        self._coef: tuple[float, float, float] | None = None

    def observe(self, widths: Sequence[int], contexts: Sequence[int], ms: float) -> None:
        """Record one measured step (same arguments as :meth:`step_ms`, plus its time)."""
        ms = _check_real("ms", ms, lo=0.0)
        _, T, _, A = _step_sums(widths, contexts)
        self._obs.append((float(T), float(A), ms))
        self._since += 1
        self._total += 1

    def _refresh(self) -> None:
        n = len(self._obs)
        if n >= self.min_observations and (self._coef is None or self._since >= self.refit_every):
            rows = [(1.0, T, A) for T, A, _ in self._obs]
            a, b, c = _nnls(rows, [ms for _, _, ms in self._obs])
            self._coef = (a, b, c)
            self._since = 0

    @property
    def fitted(self) -> bool:
        """Whether the model answers from its own fit (else from the prior/default)."""
        self._refresh()
        return self._coef is not None

    @property
    def coefficients(self) -> tuple[float, float, float] | None:
        """The fitted ``(a, b, c)`` (ms, ms/token, ms/query-key pair), or None before."""
        self._refresh()
        return self._coef

    @property
    def observations(self) -> int:
        """Steps observed in all (the fit uses the last ``window``)."""
        return self._total

    def _formula(self, T: float, A: float) -> float:
        a, b, c = self._coef if self._coef is not None else (
            DEFAULT_BASE_MS, DEFAULT_TOKEN_MS, 0.0)
        return a + b * T + c * A

    def step_ms(self, widths: Sequence[int], contexts: Sequence[int]) -> float:
        if not self.fitted and self.prior is not None:
            return self.prior.step_ms(widths, contexts)
        n, T, _, A = _step_sums(widths, contexts)
        return self._formula(T, A) if n else 0.0

    def uniform_ms(self, batch: float, width: float = 1, context: float = 256) -> float:
        if not self.fitted and self.prior is not None:
            return self.prior.uniform_ms(batch, width, context)
        batch = _check_real("batch", batch, lo=0.0)
        width = _check_real("width", width, lo=0.0)
        context = _check_real("context", context, lo=0.0)
        if batch <= 0:
            return 0.0
        return self._formula(batch * width, batch * width * (context + width))

    def describe(self) -> str:
        coef = self.coefficients
        if coef is not None:
            a, b, c = coef
            return (f"online fit over {min(self._total, self.window)} steps: "
                    f"{a:.4g} ms + {b:.4g} ms/token + {c:.4g} ms/(query·key)")
        source = (self.prior.describe() if self.prior is not None else
                  f"default {DEFAULT_BASE_MS} ms + {DEFAULT_TOKEN_MS} ms/token")
        return f"online, {self._total}/{self.min_observations} steps, not fitted: {source}"

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "coefficients": self.coefficients,
                "observations": self._total, "window": self.window,
                "prior": self.prior.to_dict() if self.prior is not None else None}


# ------------------------------------------------------------------- specs, projection


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


@dataclass(frozen=True)
class Projection:
    """The projected time of a trace of steps under one cost model."""

    total_ms: float
    steps: int
    per_step_ms: list[float] = field(repr=False)
    cost_name: str


def project(trace: Iterable[tuple[Sequence[int], Sequence[int]]],
            cost: StepCost | str | Mapping[str, Any] | None) -> Projection:
    """Cost every step ``(widths, contexts)`` of ``trace`` (any :func:`load_cost` spec)."""
    model = load_cost(cost)
    per_step = []
    for i, step in enumerate(trace):
        try:
            widths, contexts = step
        except (TypeError, ValueError):
            raise ValueError(f"trace[{i}] must be a (widths, contexts) pair") from None
        per_step.append(model.step_ms(widths, contexts))
    return Projection(math.fsum(per_step), len(per_step), per_step, model.name)
