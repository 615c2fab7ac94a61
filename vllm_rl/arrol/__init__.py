"""ARRoL, "Prune as You Generate" (Xu, Chen et al., arXiv:2603.24840): a quality head
scores each partial rollout at ``l_detect`` and the engine prunes it with a calibrated survival
probability, steering each group toward a target share of correct answers.

In the engine:

- :mod:`.rule`: the pure rule (Eq. 1 posterior, Eq. 2 survival, the seeded coin, the
  composed κ of a DARTS group) and the verdict a scored sample carries;
- :mod:`.scorer`: :class:`~.scorer.HeadScorer` on the worker (rows at ``l_detect``, one
  head call per step, verdicts with the step's output), with its parts:
  :mod:`.served_head` (the head and calibration it serves, replaced whole by an update),
  :mod:`.trace_sums` (the trace features' sums on the device), :mod:`.step_plan` (one
  step's work) and :mod:`.transfer` (its only host–device crossings);
- :mod:`.config`: :class:`~.config.ArrolConfig` (the engine's head and calibration),
  submission and runner checks;
- :mod:`.worker`: ``arrol_update`` / ``arrol_info`` on the worker.

On the trainer's side:

- :mod:`.head`: :class:`~.head.QualityHead` and :class:`~.head.HeadTrainer` (Sec. 4.2-4.3);
- :mod:`.calibration`: the calibration buffer, δ and the cold start (App. A.4);
- :mod:`.controller`: :class:`~.controller.ArrolFeedback`, Alg. 1 l.3-8 between steps for
  every trainer (every scored sample in the head's data, fitting over the buffer,
  out-of-sample calibration, the gate: a within-group AUC floor and the balance test);
- :mod:`.measures`: Spearman, AUC, trace confidence, weighted voting (Sec. 4.4).

The public names of these modules are importable from the package itself (lazily).
"""
from __future__ import annotations

from vllm_rl.lazy import exports

__getattr__ = exports(__name__, ("rule", "head", "calibration", "controller", "measures", "config"))
