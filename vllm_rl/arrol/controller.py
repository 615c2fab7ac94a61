"""ARRoL's trainer side between steps, one implementation for TRL, verl and OpenRLHF.

ARRoL Alg. 1 l.3-8 with the pieces of :mod:`vllm_rl.arrol.head`.  After each step,
:meth:`ArrolFeedback.observe` takes the step's records and rewards and returns the
keywords of the engine's ``arrol_update`` (``vllm_rl.LLM.arrol_update``, the server
route, ``RLHttpServer.arrol_update``):

1. **Every scored sample is represented** (Alg. 1 l.3-8 labels each rollout by its
   final reward; label y = reward > 0):
   - ended by the model (EOS, a stop, ``max_tokens``) or at its answer marker (DUET
     trim): labelled by its reward;
   - cancelled by a DARTS early stop: labelled by the reward of what it produced (0 for
     a sample with no answer).  That is the outcome it really earned where ARRoL steers:
     inside a DARTS group the balance Eq. 2 aims at is that of the training group, and a
     cancelled sample is in it with no answer.  DARTS decided it by its siblings'
     lengths, not by the head, so the head does not learn its own decisions;
   - removed by a coin (pruned by ARRoL's, aborted by DUET's): no label (its partial text
     would label it 0, and the head would learn its own decisions); the coin's survivors
     stand for it with their inverse propensity as weight (1/p for a survivor of ARRoL's
     coin, 1/eps for one DUET's coin kept past the gate; 1 where no coin decided, at a
     DARTS floor; capped).
2. **The head is fitted over the buffer** (the last ``window`` labels), ``epochs`` passes
   of Adam each step from the previous weights (Sec. 4.3 (iii): cross-entropy on
   detached states), not one step per RL step.
3. **Calibration** (App. A.4), out of sample: Eq. 1's counts, π and δ (E[p] = κ) from
   the scores the engine recorded, each from the head version that scored the sample
   before any head had trained on it (``head_version >= 1``: a trained head), weighted
   by the same inverse propensities (:class:`~vllm_rl.arrol.calibration.CalibrationBuffer`).
   Re-scoring the buffer with the head just fitted on it would make q over-confident on
   fresh samples, and E[p] ≠ κ.
4. **The pruning gate**: the engine prunes only after the cold start (Sec. 5: 20 steps;
   Table 7) and, with ``gate="steering"`` (the default), once Eq. 2's steering beats
   random pruning at the same keep rate on the held-out window (the last ``gate_window``
   labels whose scores came from a trained head): with the calibration about to be
   pushed, :func:`~vllm_rl.arrol.measures.steering_gain` > 2 standard errors
   (:data:`GATE_Z`) over the held-out groups, the gain being the mean over groups of
   E|ρ̂_g − ρ| under a uniform keep rate p̄ minus that under each sample's p (Eq. 2),
   inverse-propensity weighted, the same seeded coins for both.  That is the comparison
   the paper makes (Table 4: ARRoL against random pruning at one keep rate), on the
   user's own recent groups.  ``gate="cold"``: the cold start alone, as in the paper.
   ``gate="balance"`` (the project's earlier option) asks more: that the coins bring the
   groups closer to ρ than keeping every sample (:func:`~vllm_rl.arrol.measures.
   balance_gain` > 0), which removing samples from a group of 8 fails in expectation even
   at random, so that gate never opens.  ``auc_gate`` (None by default) adds a floor on
   the head's held-out within-group AUC (:func:`~vllm_rl.arrol.measures.grouped_auc`).
   Held out means prequential: each record's score came from the head the engine had
   when the sample ran, trained only on earlier steps, so the measures are out of sample
   for the head the engine is actually using.  While the gate is shut the update says
   ``cold_start=True``: the engine scores and records, never prunes.  The decision is in
   :attr:`ArrolFeedback.metrics` (``arrol/gate_open``, ``arrol/steering_*``), in every
   record (``p`` is None while shut) and on ``/metrics`` (``vllm_rl:arrol_gate_open``).

Beyond the paper, the head can read the sample's **trace features** at ``l_detect``
(``inputs="trace"`` or ``"both"``, the default; see :class:`~vllm_rl.arrol.head.QualityHead`):
on a small model the hidden state alone may not rank (``vllm-rl bench arrol``).

A head that reads the hidden state (``inputs="hidden"`` or ``"both"``) learns from
records that hold it in-process (:meth:`RolloutInfo.hidden_state`): the engine keeps the
vectors on its workers and the records name them (``hidden_id``); the caller takes them
before :meth:`ArrolFeedback.observe` with the ``arrol_hidden`` RPC
(:func:`vllm_rl.outcome.with_hidden`; ``vllm_rl.LLM.generate``, the TRL rollout, verl's
trainer and OpenRLHF's actor do it).  A record that names one it does not hold is left
out and counted (``arrol/hidden_missing``).

:attr:`ArrolFeedback.metrics` holds the step's figures (held-out AUC, the gate's test,
gate, labels).
"""
from __future__ import annotations

from collections import deque
from typing import Any, Sequence

import numpy as np
import torch

from vllm_rl.arrol.calibration import CalibrationBuffer, ColdStart
from vllm_rl.arrol.head import HEAD_INPUTS, HeadTrainer, QualityHead
from vllm_rl.arrol.measures import balance_gain, grouped_auc, steering_gain, weighted_auc
from vllm_rl.arrol.rule import posterior, survival
from vllm_rl.flags import KEY, read
from vllm_rl.outcome import Reason, RolloutInfo

CALIBRATION_FLAGS = ("kappa", "rho", "lam", "p_min", "p_max")
GATES = ("steering", "cold", "balance")
GATE_Z = 2.0    # the steering gate opens where its gain exceeds 2 standard errors (over
                # the held-out groups): beyond noise, one-sided ~98%
LABELLED = (Reason.EOS, Reason.STOP, Reason.LENGTH, Reason.DUET_TRIMMED,
            Reason.DARTS_CANCELLED)
# The project's optional floor on the head's held-out within-group AUC (auc_gate=); the
# paper has none, and ``vllm-rl bench arrol-gate`` measures the steering it would allow.
AUC_GATE = 0.65
BALANCE_DRAWS = 256


def label_weight(info: RolloutInfo, max_weight: float) -> float:
    """The inverse propensity of a label's observation (see the module docstring)."""
    w = 1.0
    if info.p is not None and not info.floor:
        w /= max(info.p, 1e-6)
    if info.keep_prob is not None and info.keep_prob < 1.0:
        w /= max(info.keep_prob, 1e-6)
    return min(w, max_weight)


class ArrolFeedback:
    """Head fitting, calibration, cold start and the pruning gate across steps (module
    docstring).  ``arrol_flags`` are the requests' ``arrol`` flags (κ, ρ, λ, p_min, p_max
    of the calibration); ``hidden_size`` is the model's (needed for a trace-only head when
    no hidden state comes back)."""

    def __init__(self, arrol_flags: dict[str, Any] | None = None, *, inputs: str = "both",
                 hidden_size: int | None = None, width: int = 128,
                 cold_start_steps: int = 20, gate: str = "steering",
                 auc_gate: float | None = None, gate_window: int = 256,
                 gate_min: int = 64, window: int = 2048, epochs: int = 20, lr: float = 1e-3,
                 weight_decay: float = 1e-2, max_weight: float = 20.0, seed: int = 0) -> None:
        if inputs not in HEAD_INPUTS:
            raise ValueError(f"ArrolFeedback inputs={inputs!r}: allowed {HEAD_INPUTS}")
        if gate not in GATES:
            raise ValueError(f"ArrolFeedback gate={gate!r}: allowed one of {GATES}")
        if auc_gate is not None and not 0.0 <= auc_gate <= 1.0:
            raise ValueError(f"ArrolFeedback auc_gate={auc_gate!r}: allowed a float in [0, 1] "
                             "or None (no AUC floor)")
        arrol = read({KEY: {"arrol": dict(arrol_flags or {})}}).arrol
        self.calibration_flags = {k: getattr(arrol, k) for k in CALIBRATION_FLAGS}
        self.inputs, self.hidden_size, self.width = inputs, hidden_size, width
        self.auc_gate, self.gate_min, self.epochs = auc_gate, gate_min, epochs
        self.gate = gate
        self.lr, self.weight_decay, self.max_weight, self.seed = lr, weight_decay, max_weight, seed
        self.cold = ColdStart(cold_start_steps)
        self.calibration = CalibrationBuffer(window=window)
        self.buffer: deque = deque(maxlen=window)         # (hidden, trace, label, weight)
        self.heldout: deque = deque(maxlen=gate_window)   # (engine score, label, weight,
                                                          #  group: (update, group id))
        self.head: QualityHead | None = None
        self.trainer: HeadTrainer | None = None
        self.version = 0
        self.gate_open = False
        self.metrics: dict[str, float] = {}
        self._missing = 0                                 # this step's records whose hidden
                                                          # state was named, not taken

    # ------------------------------------------------------------------ labels
    def _rows(self, infos, rewards, groups):
        uses_hidden = self.inputs != "trace"
        self._missing = 0
        for info, r, g in zip(infos, rewards, groups):
            if info is None or info.reason not in LABELLED or info.score is None:
                continue
            if uses_hidden and info.hidden_state() is None:
                self._missing += info.hidden_id is not None   # named, never taken
                continue
            if info.trace is None:
                continue
            yield info, (1 if float(r) > 0 else 0), label_weight(info, self.max_weight), g

    def observe(self, infos: Sequence[RolloutInfo | None], rewards: Sequence[float],
                groups: Sequence[Any] | None = None) -> dict[str, Any] | None:
        """One step's records and rewards → ``arrol_update`` keywords (or None when no
        sample could be labelled yet).  ``groups``: each sample's prompt (any hashable;
        default the record's ``group_id``), for the within-group AUC of the gate; samples
        with neither count as one group (the step's: the AUC is then pooled)."""
        self.cold.tick()
        if groups is None:
            groups = [i.group_id if i is not None else None for i in infos]
        rows = list(self._rows(infos, rewards, groups))
        for info, y, w, g in rows:
            if info.head_version is not None and info.head_version >= 1:
                # scored by a trained head, before any head trained on it: out of sample
                self.heldout.append((float(info.score), y, w, (self.version, g)))
                self.calibration.add([info.score], [y], [w])
            hidden = info.hidden_state() if self.inputs != "trace" else None
            self.buffer.append((hidden, tuple(info.trace), y, w))
        if not self.buffer:
            return None
        self._fit()
        heldout, pooled = self._heldout_auc()
        cold = self.cold.active
        ranks = self.auc_gate is None or (heldout is not None and heldout >= self.auc_gate)
        calibration, test = None, None
        if not cold and ranks:
            calibration = self.calibration.calibration(**self.calibration_flags,
                                                       auc=heldout)
            if self.gate != "cold":
                test = self._test(calibration)
                if test is None or test["gain"] <= GATE_Z * test.get("se", 0.0):
                    calibration = None          # steering would not help: score only
        self.gate_open = calibration is not None
        self.version += 1
        labels = [y for _, _, y, _ in self.buffer]
        self.metrics = {"arrol/labels": float(len(rows)), "arrol/buffer": float(len(labels)),
                        "arrol/hidden_missing": float(self._missing),
                        "arrol/heldout_auc": heldout if heldout is not None else float("nan"),
                        "arrol/heldout_auc_pooled": pooled if pooled is not None
                        else float("nan"),
                        "arrol/calibration_samples": float(len(self.calibration)),
                        "arrol/gate_open": float(self.gate_open),
                        **{f"arrol/{self.gate}_{k}": v for k, v in (test or {}).items()},
                        "arrol/cold_start": float(cold),
                        "arrol/positive_share": sum(labels) / len(labels)}
        return {"head": self.head.export(self.version),
                "calibration": calibration.to_dict() if calibration is not None else None,
                "cold_start": calibration is None, "version": self.version}

    # ------------------------------------------------------------------ fitting
    def _tensors(self):
        hidden = None
        if self.inputs != "trace":
            hidden = torch.from_numpy(np.stack([h for h, _, _, _ in self.buffer])).float()
        trace = torch.tensor([t for _, t, _, _ in self.buffer], dtype=torch.float32)
        labels = torch.tensor([y for _, _, y, _ in self.buffer], dtype=torch.float32)
        weights = torch.tensor([w for _, _, _, w in self.buffer], dtype=torch.float32)
        if hidden is None:
            hidden = torch.zeros(len(labels), self._hidden_size())
        return hidden, trace, labels, weights

    def _hidden_size(self) -> int:
        if self.hidden_size is None:
            raise ValueError("ArrolFeedback(inputs='trace') needs hidden_size= (the model's) "
                             "when the records carry no hidden state")
        return self.hidden_size

    def _fit(self) -> None:
        hidden, trace, labels, weights = self._tensors()
        if self.head is None:
            torch.manual_seed(self.seed)
            self.head = QualityHead(hidden.shape[1], width=self.width, inputs=self.inputs)
            self.trainer = HeadTrainer(self.head, lr=self.lr, weight_decay=self.weight_decay)
        gen = torch.Generator().manual_seed(self.seed + self.version)
        features = trace if self.head.features else None
        self.trainer.fit(hidden, labels, epochs=self.epochs, batch_size=128, generator=gen,
                         features=features, weights=weights)

    def _test(self, calibration) -> dict[str, float] | None:
        """The gate's test of the held-out window under ``calibration`` (each sample's p
        by Eq. 2 from its recorded score): :func:`~vllm_rl.arrol.measures.steering_gain`
        (``gate="steering"``) or :func:`~vllm_rl.arrol.measures.balance_gain`."""
        if len(self.heldout) < self.gate_min:
            return None
        f = self.calibration_flags
        s, y, w, g = zip(*self.heldout)
        p = [survival(posterior(calibration, v), calibration.delta, f["kappa"], f["rho"],
                      f["lam"], f["p_min"], f["p_max"]) for v in s]
        test = steering_gain if self.gate == "steering" else balance_gain
        return test(p, y, w, g, f["rho"], draws=BALANCE_DRAWS, seed=self.seed + self.version)

    def _heldout_auc(self) -> tuple[float | None, float | None]:
        """The held-out AUC within groups (the gate's) and pooled across them."""
        if len(self.heldout) < self.gate_min:
            return None, None
        s, y, w, g = zip(*self.heldout)
        if sum(y) == 0 or sum(y) == len(y):
            return None, None
        return grouped_auc(s, y, w, g), weighted_auc(s, y, w)


__all__ = ["AUC_GATE", "ArrolFeedback", "GATES", "BALANCE_DRAWS", "label_weight", "LABELLED"]
