"""Per-step checkpoints of a ``vllm-rl bench train`` run: a stopped run resumes from its
last finished step (``--resume``), not from its start.

Each finished step, TRL writes its checkpoint (weights, optimizer, scheduler, RNG and
the partial rollouts' carry buffer: :class:`~vllm_rl.integrations.trl.trainer.
RLGRPOTrainer`) into ``OUT/ckpt/CONFIG-sSEED/checkpoint-N``, and :func:`save` adds the
benchmark's own state beside it (:data:`STATE`): the step rows so far, the budget
spent, the held-out start, and the rollout function's controllers (ARRoL's feedback and
the head it last pushed, DARTS's planner, DUET's allocator, the calls that seed the
samples).  :func:`restore` puts them back and pushes the head to the engine.

What a resumed run does not get back is the engine's own memory: DAS's suffix trees and
DUET's online length estimate start empty at the step it resumes from, as after an
engine restart; the run's JSON names the steps it resumed at (``resumed_at``).
"""
from __future__ import annotations

import os
import pickle
import re
import shutil
from pathlib import Path
from typing import Any

STATE = "bench_state.pkl"
#: The rollout function's attributes a resumed run needs (its controllers and seeds).
ROLLOUT_STATE = ("calls", "_seen", "planner", "duet_allocation", "arrol_feedback",
                 "last_arrol_update")


def folder(out: str | Path, name: str, seed: int) -> Path:
    """The run's checkpoint folder (TRL's ``output_dir``)."""
    return Path(out) / "ckpt" / f"{name.replace(':', '_').replace('+', '_')}-s{seed}"


def latest(run_dir: Path) -> Path | None:
    """The newest ``checkpoint-N`` in ``run_dir`` that holds the benchmark's state."""
    found = []
    for p in run_dir.glob("checkpoint-*"):
        m = re.fullmatch(r"checkpoint-(\d+)", p.name)
        if m and (p / STATE).exists():
            found.append((int(m.group(1)), p))
    return max(found)[1] if found else None


def save(checkpoint: Path, run: dict[str, Any], rollout: Any) -> None:
    """The benchmark's state into a TRL checkpoint folder, written whole then moved."""
    state = {"run": run, "rollout": {k: getattr(rollout, k) for k in ROLLOUT_STATE}}
    tmp = checkpoint / (STATE + ".tmp")
    with open(tmp, "wb") as f:
        pickle.dump(state, f)
    os.replace(tmp, checkpoint / STATE)


def restore(checkpoint: Path, rollout: Any, llm: Any) -> dict[str, Any]:
    """The state :func:`save` kept: the rollout function's controllers set back, the
    ARRoL head it last pushed pushed again; returns the run's saved fields."""
    with open(checkpoint / STATE, "rb") as f:
        state = pickle.load(f)
    for key, value in state["rollout"].items():
        setattr(rollout, key, value)
    if rollout.last_arrol_update is not None:
        llm.arrol_update(**rollout.last_arrol_update)
    return state["run"]


def clear(run_dir: Path) -> None:
    """A finished run's checkpoints (its JSON keeps what it measured)."""
    shutil.rmtree(run_dir, ignore_errors=True)
