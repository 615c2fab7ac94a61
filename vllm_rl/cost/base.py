"""The step-cost interface: the time of one engine step, and the projection of a trace.

A step is a list of sequences; sequence i computes ``widths[i]`` query tokens (1: plain
decode; 1 + k: verifying k draft tokens; more: a prefill chunk) against ``contexts[i]``
tokens already cached before the step.  Every model answers :meth:`StepCost.step_ms`,
and from it the planning views the controllers use: :meth:`StepCost.uniform_ms` (B
identical sequences), :meth:`StepCost.ptl` (DARTS' PTL(B), App. A / Eq. 4) and
:meth:`StepCost.verify_extra_ms` (DAS' marginal cost of drafting width).

The models are :class:`~vllm_rl.cost.table.TableCost` (a measured table) and
:class:`~vllm_rl.cost.online.OnlineCost` (fitted online); :func:`~vllm_rl.cost.load.load_cost`
builds either from a spec; :func:`~vllm_rl.cost.projection.project` costs a trace of steps.

Pure Python (stdlib only, no torch): the scheduler and the workers import it cheaply.
"""
from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from vllm_rl.checks import check_int as _check_int
from vllm_rl.checks import check_real as _check_real
from vllm_rl.checks import check_same_length as _check_same_length

__all__ = ["DATA_DIR", "TABLES", "StepCost"]

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

    def width_curve(self, batch: float, widths: Sequence[float],
                    context: float = 256) -> list[float]:
        """:meth:`uniform_ms` at one batch and context for each of ``widths``: the curve
        a batch cap reads once per step (one draft length per point).  Subclasses may
        evaluate it at once; the values are :meth:`uniform_ms`'s."""
        return [self.uniform_ms(batch, w, context) for w in widths]

    def step_ms(self, widths: Sequence[int], contexts: Sequence[int]) -> float:
        """One step in which sequence i computes ``widths[i]`` query tokens against
        ``contexts[i]`` cached tokens (see the class docstring).  Empty step: 0."""
        n, T, C, _ = _step_sums(widths, contexts)
        return self.uniform_ms(n, T / n, C / n) if n else 0.0

    def ptl(self, context: float = 256) -> Callable[[int], float]:
        """PTL(B) of DARTS (App. A, Eq. 4): the time of a decode step at batch B, the one
        PTL the project plans with (:mod:`vllm_rl.darts.rollout_budget`'s ``rollout_cost``,
        ``cost_slope``)."""
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
