"""``vllm-rl bench overhead``: what vllm_rl costs the host, per request per step.

:mod:`vllm_rl.bench.overhead.command` is the command line; its modes are
:mod:`vllm_rl.bench.overhead.host` (the engines' host time per request-step, with its
figures in :mod:`vllm_rl.bench.overhead.budget`), :mod:`vllm_rl.bench.overhead.scheduler`
(the schedulers alone, on hand-built outputs; also the scheduler tests' harness) and
:mod:`vllm_rl.bench.overhead.throughput` (flagless throughput A/B), and
:mod:`vllm_rl.bench.overhead.das_drafter` times the DAS drafter alone (``--das-host``).
"""
