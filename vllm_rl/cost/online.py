"""A step-cost model fitted online to the engine's own steps: :class:`OnlineCost`.

DAS (Sec. 4.2.1, Eq. 1-2) costs a forward pass as T = c_base + c_tok · tokens; this is ms ≈
a + b·T + c·A (A = Σ wᵢ(cᵢ + wᵢ), the attention work), non-negative least squares over a
sliding window of observed steps, with a prior (e.g. a
:class:`~vllm_rl.cost.table.TableCost`) until it has enough.
"""
from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from itertools import combinations
from typing import Any
from vllm_rl.checks import check_int as _check_int
from vllm_rl.checks import check_real as _check_real
from vllm_rl.cost.base import StepCost, _step_sums


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
        _, T, _, A = _step_sums(widths, contexts)
        self.observe_sums(T, A, ms)

    def observe_sums(self, tokens: float, attention: float, ms: float) -> None:
        """:meth:`observe` from the step's sums: ``tokens`` = Σ wᵢ and ``attention`` =
        Σ wᵢ·(cᵢ + wᵢ) (for callers that hold the step as arrays: no per-sequence loop)."""
        ms = _check_real("ms", ms, lo=0.0)
        self._obs.append((float(tokens), float(attention), ms))
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


__all__ = ["OnlineCost"]
