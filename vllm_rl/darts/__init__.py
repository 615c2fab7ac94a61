"""DARTS, distribution-aware rollout trajectory shaping (Wang, Chen, Luo et al.,
arXiv:2605.30859): each prompt gets M' >= M redundant samples; the training group is the K
shortest plus the L longest
valid ones (dual-end), or, where the allocation saturates, the M shortest, the group
stopped as soon as they are known.

In the engine: :mod:`.rule` (the exact shortest-M early stop, the selections).  On the
trainer's side: :mod:`.controller` (length statistics, Alg. 1's allocation, Alg. 2's
switch, :class:`~.controller.DartsPlanner`) and :mod:`.rollout_budget` (Eq. 4, 6, 8-9).  The public
names of these modules are importable from the package itself (lazily).
"""
from __future__ import annotations

from vllm_rl.lazy import exports

__getattr__ = exports(__name__, ("rule", "controller", "rollout_budget"))
