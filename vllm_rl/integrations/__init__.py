"""Drop-ins for RL frameworks: each subpackage registers vllm_rl with one framework
through that framework's own extension points (``vllm_rl.integrations.verl``)."""
