"""ARRoL's trainer side between verl steps: train the head, calibrate, push to the servers.

ARRoL Alg. 1 l.3-8 with the pieces of :mod:`vllm_rl.control.arrol`: after each step the
samples scored at ``l_detect`` (their records carry the head's score and, with
``arrol.return_hidden``, the hidden state) and their rewards (label y = reward > 0)

1. train the quality head on the detached hidden states (``HeadTrainer``, Sec. 4.3),
2. re-score those states with the trained head and add (score, y) to the sliding
   ``CalibrationBuffer`` (Eq. 1 counts, π, δ solved so the mean survival is κ, App. A.4),
3. while the cold start lasts (``ColdStart``, 20 steps by default) push only the head
   (the engine scores, never prunes); afterwards the head and its calibration.

:meth:`ArrolFeedback.observe` returns the keywords of the servers' ``arrol_update``
(``RLHttpServer.arrol_update``, ``vllm_rl.LLM.arrol_update``), or None when no sample was
scored.  The calibration's κ, ρ, λ, p_min, p_max are the requests' own ``arrol`` flags.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

from vllm_rl.control.arrol import CalibrationBuffer, ColdStart, HeadTrainer, QualityHead
from vllm_rl.flags import normalize
from vllm_rl.outcome import RolloutInfo

CALIBRATION_FLAGS = ("kappa", "rho", "lam", "p_min", "p_max")


class ArrolFeedback:
    """Head training, calibration and cold start across steps (module docstring)."""

    def __init__(self, arrol_flags: dict[str, Any] | None = None, *, width: int = 128,
                 cold_start_steps: int = 20, window: int = 2048, lr: float = 1e-3,
                 seed: int = 0) -> None:
        canonical = normalize({"arrol": dict(arrol_flags or {})})["arrol"]
        self.calibration_flags = {k: canonical[k] for k in CALIBRATION_FLAGS if k in canonical}
        self.width, self.lr, self.seed = width, lr, seed
        self.buffer = CalibrationBuffer(window=window)
        self.cold = ColdStart(cold_start_steps)
        self.head: QualityHead | None = None
        self.trainer: HeadTrainer | None = None
        self.version = 0

    def observe(self, infos: Sequence[RolloutInfo | None],
                rewards: Sequence[float]) -> dict[str, Any] | None:
        """One step's records and rewards → ``arrol_update`` keywords (or None)."""
        rows = [(info.hidden_state(), float(r)) for info, r in zip(infos, rewards)
                if info is not None and info.hidden is not None]
        self.cold.tick()
        if not rows:
            return None
        hidden = torch.from_numpy(np.stack([h for h, _ in rows])).float()
        labels = torch.tensor([1.0 if r > 0 else 0.0 for _, r in rows])
        if self.head is None:
            torch.manual_seed(self.seed)
            self.head = QualityHead(hidden.shape[1], width=self.width)
            self.trainer = HeadTrainer(self.head, lr=self.lr)
        self.trainer.step(hidden, labels)
        with torch.no_grad():
            scores = self.head.score(hidden).tolist()
        self.buffer.add(scores, [int(y) for y in labels.tolist()])
        self.version += 1
        calibration = self.cold.calibration(self.buffer, **self.calibration_flags)
        return {"head": self.head.export(self.version),
                "calibration": calibration.to_dict() if calibration is not None else None,
                "cold_start": calibration is None, "version": self.version}
