"""``vllm-rl bench train``: time to accuracy end to end, GRPO through the engine.

:mod:`vllm_rl.bench.train.command` is the command line; its parts are
:mod:`vllm_rl.bench.train.run` (one run: a worker process, its engines and trainer),
:mod:`vllm_rl.bench.train.budget` (every step priced on each time axis, and the budget a
configuration trains within), :mod:`vllm_rl.bench.train.report` (the tables, the
intervals over seeds and the picture) and :mod:`vllm_rl.bench.train.resume` (per-step
checkpoints, ``--resume``).
"""
