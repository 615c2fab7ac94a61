"""DUET, token-budget allocation for RLVR (Hu, Zhao, Xu, Jacoby, arXiv:2605.08441): a
marker detector is polled every few tokens; a rollout past ``K2 + G`` with no marker is
aborted, except that with probability ε it is kept and weighted 1/ε, so the gradient
stays unbiased.

In the engine: :mod:`.rule` (the per-sample rule of Alg. A.10 l.12-33, the online K1/K2
of App. A.3 from censored natural lengths) and :mod:`.markers` (the answer detectors).
On the trainer's side: :mod:`.allocation` (Theorem 1's Neyman allocation, Eq. 4),
:mod:`.weights` (Eq. 6) and :mod:`.controller` (:class:`~.controller.DuetController`).
The public names of these modules are importable from the package itself (lazily).
"""
from __future__ import annotations

from vllm_rl.lazy import exports

__getattr__ = exports(__name__, ("rule", "markers", "allocation", "weights", "controller"))
