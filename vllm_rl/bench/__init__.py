"""The benchmark harness, one package (``vllm-rl bench ...``, :mod:`vllm_rl.cli.bench`).

- :mod:`.engines`: the two engines every benchmark compares (stock vLLM and the RL engine,
  in-process with the step trace; optionally with an H100's scheduler limits);
- :mod:`.matrix`: what each configuration sends (each technique alone, all four);
- :mod:`.step`: one rollout step per configuration vs stock (``vllm-rl bench``);
- :mod:`.train`: time to accuracy, GRPO through the engine (``vllm-rl bench train``);
- :mod:`.das`, :mod:`.das_batch`, :mod:`.arrol`, :mod:`.overhead`: the technique benchmarks;
- :mod:`.host_parts`: each engine's host time per step, part by part;
- :mod:`.serve`: RL-shaped load against running servers (``vllm-rl serve-bench``);
- :mod:`.plots`, :mod:`.logs`: pictures and vLLM's log to a file.

``benchmarks/`` in the checkout holds only stand-alone micro-benchmarks (the suffix tree,
the ARRoL head kernel, the PTL curve).
"""
