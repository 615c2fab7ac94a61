"""The README's own-model path: ``examples/train_your_model.py`` run as a user runs it, with
the embedded model passed in as "your model" (``--model PATH``), a tiny config.

TRL's GRPO trains the model while the engine, built on the same path, generates with the
four techniques on and the example's default partial rollouts (a step trains its complete
groups and carries the rest); the trainer's weights reach the engine every step
(RolloutFunc), and after training the engine's log-probs equal the trained model's while
the policy moved.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.engine

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_your_model.py"
STEPS, PROMPTS, M = 2, 3, 4


def test_train_your_model_syncs_the_engine_and_returns_records(tmp_path):
    from vllm_rl.task import MODEL_PATH

    report = tmp_path / "report.json"
    cmd = [sys.executable, str(EXAMPLE), "--model", str(MODEL_PATH), "--steps", str(STEPS),
           "--prompts", str(PROMPTS), "--m", str(M), "--max-tokens", "64", "--lr", "1e-4",
           "--techniques", "das,darts,duet,arrol",
           "--dtype", "float32",       # the check's tolerance: a float32 engine agrees to ~1e-5
           "--out", str(tmp_path / "out"), "--report", str(report)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path,
                          env={**os.environ, "VLLM_CONFIGURE_LOGGING": "0"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "All reward functions returned None" not in done.stdout + done.stderr, \
        "RLGRPOTrainer drops TRL's warning for samples masked out of the baseline"
    out = json.loads(report.read_text())

    assert out["global_step"] == STEPS
    assert out["loaded_step"] == STEPS, "the last step's weights went into the engine"
    assert [s["engine_weights_of_step"] for s in out["steps"]] == list(range(STEPS)), \
        "each step's rollout ran on the weights of the step before"
    assert out["techniques"] == ["das", "darts", "duet", "arrol"] and out["partial"]
    carried_in = 0                 # samples the step before carried: groups completed now
    for step in out["steps"]:      # the complete groups came back: M' >= M per prompt
        assert 0 < step["prompts"] <= PROMPTS + carried_in
        assert step["records"] >= step["prompts"] * M
        carried_in = step["carried"]
        assert sum(step["reasons"].values()) == step["records"]
        assert 0 < step["in_loss"] <= step["prompts"] * M
    assert any(step["carried"] for step in out["steps"]), "partial rollouts carried none"
    reasons = {r for s in out["steps"] for r in s["reasons"]}
    assert reasons & {"eos", "length", "duet_trimmed"}, reasons

    sync = out["sync"]
    tol = 1e-3
    assert sync["before_max_abs_dlogp"] < tol, sync      # same weights at the start
    assert sync["after_max_abs_dlogp"] < tol, sync       # and after training: synced
    assert sync["policy_moved"] > 10 * tol, sync         # though training moved the policy
