"""One hardware step-cost model that the engine and the controllers plan with.

An engine step runs B sequences; sequence i computes wᵢ query tokens (1: decode;
1 + k: verifying k drafts; more: a prefill chunk) against cᵢ cached tokens.  A
:class:`StepCost` answers the step's time in ms, :meth:`StepCost.step_ms`, and the
views the controllers need:

* DARTS (App. A, Eq. 4) costs a rollout with the per-token latency curve PTL(B), the
  time of one decode step at batch B: :meth:`StepCost.ptl` returns it, the one PTL the
  project plans with (:mod:`vllm_rl.darts.rollout_budget`'s ``rollout_cost`` / ``cost_slope``).
* DAS (Sec. 4.2.1, Eq. 1-2) costs a forward pass as T = c_base + c_tok · tokens; that
  is :class:`OnlineCost`'s a + b·T (plus c·A for attention work, A = Σ wᵢ(cᵢ + wᵢ)),
  fitted online to the engine's own steps.  :meth:`StepCost.verify_extra_ms` is the
  marginal cost of widening a step to verify drafts, what a draft budget trades.

Two sources:

* :class:`TableCost`: a measured table (packaged: ``h100``, Qwen3-8B and Qwen3-1.7B,
  bf16, CUDA graphs), interpolated piecewise-linearly in log B, q and log L and
  extrapolated linearly (in B, q and L) past the grid; monotone by construction.
  ``python -m vllm_rl.cost.measure`` measures one on any CUDA machine with PyTorch.
* :class:`OnlineCost`: non-negative least squares over a sliding window of observed
  steps, with a prior (e.g. a TableCost) until it has enough.

:func:`load_cost` builds either from a spec (``None``/``"online"``, ``"h100"``,
``"h100:qwen3-1.7b"``, ``"table.json:shape"``, ``{"table": ..., "shape": ...}``);
:func:`project` costs a trace of steps; :func:`host_counted` adds the host time measured
around each step (:mod:`vllm_rl.cost.host`).  Pure Python; importing this imports no torch.
"""
from __future__ import annotations

from vllm_rl.cost.base import StepCost
from vllm_rl.cost.host import host_counted
from vllm_rl.cost.load import load_cost
from vllm_rl.cost.online import OnlineCost
from vllm_rl.cost.projection import Projection, project
from vllm_rl.cost.table import TableCost

__all__ = ["OnlineCost", "Projection", "StepCost", "TableCost", "host_counted", "load_cost",
           "project"]
