"""``vllm-rl bench step`` (and ``vllm-rl bench`` alone): one RL rollout step per
configuration against stock vLLM.

:mod:`vllm_rl.bench.step.command` is the command line; its parts are
:mod:`vllm_rl.bench.step.run` (one configuration's step through the engine, priced, and
the untimed steps before it) and :mod:`vllm_rl.bench.step.report` (medians, speed-ups,
the table and the pictures).  ``vllm-rl bench points`` runs it by batch size.
"""
