"""Trainer-side code every integration shares (TRL, verl, OpenRLHF).

* :mod:`.marks`: each sample's place in the loss from its record — in the loss or not,
  its weight, and whether its reward counts in its group's baseline — under the
  composition rule of ``docs/ARCHITECTURE.md``;
* :mod:`.advantages`: group-relative advantages over those baselines, and the step
  diagnostics a trainer reads every step;
* :mod:`.feedback`: ARRoL's head training, calibration and pruning gate between steps;
* :mod:`.planner`: DARTS's per-prompt redundancy (Alg. 1) and sampling mode (Alg. 2).
"""
