"""The benchmark harness, one package (``vllm-rl bench ...``, :mod:`vllm_rl.cli.bench`).

- :mod:`.engines`: the two engines every benchmark compares (stock vLLM and the RL engine,
  in-process with the step trace; optionally with an H100's scheduler limits);
- :mod:`.matrix`: what each configuration sends (each technique alone, all four);
- :mod:`vllm_rl.bench.step`: one rollout step per configuration vs stock (``vllm-rl bench``:
  its command line and its parts, one folder);
- :mod:`vllm_rl.bench.train`: time to accuracy end to end, GRPO through the engine
  (``vllm-rl bench train``: its command line and its parts, one folder);
- :mod:`.das`, :mod:`.das_batch`, :mod:`.arrol`, :mod:`.arrol_gate`, :mod:`.duet_gate`: the
  technique benchmarks;
- :mod:`vllm_rl.bench.overhead`: the host cost per request-step (``vllm-rl bench overhead``:
  its command line and its modes, one folder);
- :mod:`.points`: the operating-point table; :mod:`.report`: a table again from its JSON;
- :mod:`.host_parts`: each engine's host time per step, part by part;
- :mod:`.serve`: RL-shaped load against running servers (``vllm-rl serve-bench``);
- :mod:`.plots`, :mod:`.logs`: pictures and vLLM's log to a file.

Each ``vllm-rl bench`` subcommand is one module here, or one folder with its command
line in ``command.py`` (:data:`vllm_rl.cli.bench.SUBCOMMANDS`); the rest are their
shared parts.  An investigation that answered one question once leaves the package with
its test, and ``docs/benchmarks.md`` names the commit that ran it.  ``benchmarks/`` in the
checkout holds only stand-alone micro-benchmarks (the suffix tree, the ARRoL head kernel,
the PTL curve, the record's carrier).
"""
