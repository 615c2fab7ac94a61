"""The budget of ``vllm-rl bench train``: each step priced end to end on a named topology
(:mod:`vllm_rl.cost.trainer`), the rollout-only axes beside it, and the time each
configuration may spend (:func:`budget_of`: stock's, on the axis :func:`spend_key` names).

A step's row keeps its rollout projected on the topology's step-cost table (``h100_s``,
the forward passes; ``h100_host_s``, host time counted) and the batch its trainer
trained (``trained``: each row's prompt and completion lengths).  :func:`price` adds the
trainer's time and the step's end-to-end time on every axis:

* ``e2e_s``: the topology's own accounting (colocated: rollout + trainer + sync;
  overlap: max(rollout, trainer) + sync), the rollout host counted: the headline axis;
* ``e2e_colocated_s`` / ``e2e_overlap_s``: each accounting;
* ``e2e_trainer_x0.5_s`` / ``e2e_trainer_x2_s``: the topology's accounting with the
  trainer's passes and optimizer at half and twice their modelled time (the
  sensitivity);
* ``e2e_gpu_s``: the topology's accounting with the rollout's forward passes alone
  (``h100_s``): a host fast enough to hide all its work under them, the bound on what
  the host time measured here costs;
* ``h100_host_s``: the rollout alone, host counted; ``h100_s``: its forward passes.
"""
from __future__ import annotations

from typing import Any

from vllm_rl.cost.trainer import ACCOUNTINGS, TrainedBatch, TrainerCost, end_to_end

#: Trainer-time multipliers of the sensitivity axes.
SENSITIVITY = (0.5, 2.0)

#: The axes, by label: the step row's key.  The first is the headline.
AXES = {"e2e": "e2e_s", "rollout": "h100_host_s", "gpu": "h100_s",
        **{f"e2e {a}": f"e2e_{a}_s" for a in ACCOUNTINGS},
        **{f"trainer x{k:g}": f"e2e_trainer_x{k:g}_s" for k in SENSITIVITY},
        "e2e host hidden": "e2e_gpu_s"}

#: What each axis counts, in words (the tables' and the plot's labels).
AXIS_WORDS = {"e2e": "end to end (rollout host counted + trainer + sync, the topology's "
                     "accounting)",
              "rollout": "rollout only, host counted", "gpu": "rollout only, GPU only",
              "e2e colocated": "colocated: rollout + trainer + sync",
              "e2e overlap": "one-step overlap: max(rollout, trainer) + sync",
              **{f"trainer x{k:g}": f"end to end, the trainer's time x{k:g}"
                 for k in SENSITIVITY},
              "e2e host hidden": "end to end, the host hidden (rollout GPU only + trainer "
                                 "+ sync)"}


def trained_of(row: dict) -> TrainedBatch | None:
    t = row.get("trained")
    return None if t is None else TrainedBatch.of(t["prompt_lengths"], t["completion_lengths"])


def price_step(row: dict, cost: TrainerCost) -> dict[str, Any]:
    """The trainer's parts and every end-to-end axis of one step (empty where the row has
    no trained batch: runs written before the trainer was charged)."""
    batch = trained_of(row)
    if batch is None or "h100_host_s" not in row:
        return {}
    rollout = row["h100_host_s"]
    own = cost.step(batch)
    out: dict[str, Any] = {"trainer": own.to_dict(),
                           "e2e_s": end_to_end(rollout, own, cost.topo.accounting)}
    for a in ACCOUNTINGS:
        out[f"e2e_{a}_s"] = end_to_end(rollout, own, a)
    for k in SENSITIVITY:
        out[f"e2e_trainer_x{k:g}_s"] = end_to_end(rollout, cost.with_scale(k).step(batch),
                                                  cost.topo.accounting)
    if "h100_s" in row:
        out["e2e_gpu_s"] = end_to_end(row["h100_s"], own, cost.topo.accounting)
    return out


def price(runs: list[dict], cost: TrainerCost) -> None:
    """:func:`price_step` into every step of ``runs``, in place."""
    for run in runs:
        for row in run["steps"]:
            row.update(price_step(row, cost))


def reprice(runs: list[dict]) -> None:
    """:func:`price` every run that names its topology again, in place, on its own
    topology and trainer cost: the same figures for the axes it was recorded with, and
    the axes added since for runs recorded before them."""
    costs: dict[tuple, TrainerCost] = {}
    for run in runs:
        a = run.get("args") or {}
        if a.get("topology"):
            key = (a["topology"], a.get("trainer_cost"))
            if key not in costs:
                costs[key] = TrainerCost.load(*key)
            price([run], costs[key])


def present(runs: list[dict]) -> dict[str, str]:
    """The axes every step of every run has, in :data:`AXES`' order."""
    return {label: key for label, key in AXES.items()
            if runs and all(key in row for r in runs for row in r["steps"])}


def spend_key(args) -> str:
    """The step row's key a ``--budget`` is spent on: ``e2e_s`` (time: end to end on the
    topology) or ``h100_host_s`` (rollout)."""
    return "h100_host_s" if args.budget == "rollout" else "e2e_s"


def budget_of(stock_run: dict, args) -> float | None:
    """A configuration's budget for the seed of ``stock_run``: stock's projected time over
    its steps on the budget's axis (:func:`spend_key`: end to end, or the rollout alone;
    None under ``--budget steps``)."""
    if args.budget == "steps":
        return None
    key = spend_key(args)
    return sum(row[key] for row in stock_run["steps"])
