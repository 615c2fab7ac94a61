"""ARRoL in the engine: the quality head on the worker, its settings and its updates.

Paper: "ARRoL" (``shared/seeds/003``), Sec. 4.2-4.3, App. A.4-A.5.

- :mod:`vllm_rl.arrol.config`: :class:`ArrolConfig` (engine-level: the head's initial
  weights and calibration), submission checks, the runner check;
- :mod:`vllm_rl.arrol.scorer`: :class:`HeadScorer`, on the worker: picks the rows whose
  ``l_detect``-th token the step computes, scores them in one call
  (:func:`vllm_rl.kernels.score_rows`), decides with the calibration (Eq. 1-2) and a
  seeded coin, and hands the verdicts to the scheduler with the step's output;
- :mod:`vllm_rl.arrol.worker`: ``arrol_update`` / ``arrol_info`` on the worker
  (``collective_rpc``), the way head weights and calibrations arrive while serving.

The pure rule is :mod:`vllm_rl.engine.policies.arrol`; the trainer side (the head
module, its training, the calibration buffer, δ) is :mod:`vllm_rl.control.arrol`.
"""
