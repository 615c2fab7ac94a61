"""Trainer-side code every integration shares (TRL, verl, OpenRLHF).

* :mod:`.marks`: each sample's place in the loss from its record — in the loss or not,
  its weight, and whether its reward counts in its group's baseline — under the
  composition rule of ``docs/ARCHITECTURE.md``;
* :mod:`.advantages`: group-relative advantages over those baselines, and the step
  diagnostics a trainer reads every step;
* :mod:`.policy`: the per-sample flags a rollout policy chooses (``RolloutPolicy``,
  ``Sample``, ``StaticPolicy``);
* :mod:`.rpc`: the actors' RPC mixin, built from the one table in :mod:`vllm_rl.rpc`;
* :mod:`.hooks`: :func:`~.hooks.after_import`, code run right after a framework's module
  is imported.

Between steps, ARRoL's head training, calibration and pruning gate is
:class:`vllm_rl.arrol.controller.ArrolFeedback`, and DARTS's per-prompt redundancy (Alg. 1)
and sampling mode (Alg. 2) :class:`vllm_rl.darts.controller.DartsPlanner`.  A framework's
integration imports this package, never another framework's.
"""
