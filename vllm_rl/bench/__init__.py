"""Rollout benchmarks in the package: the step-loop core (:mod:`.step`) and the quick
benchmark ``vllm-rl bench`` runs (:mod:`.quick`)."""
