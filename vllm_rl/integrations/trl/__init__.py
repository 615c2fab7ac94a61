"""vllm_rl for TRL (checked against trl 1.16.0).

* In-process GRPO with the records in the loss: :class:`.rollout.RolloutFunc` as
  ``GRPOTrainer``'s ``rollout_func`` on a :class:`vllm_rl.LLM`,
  :func:`.rollout.masked_reward` around the reward functions,
  :class:`.trainer.RLGRPOTrainer` for the loss weights (``vllm-rl bench train`` runs it).
* Colocated mode: :func:`.colocate.use_vllm_rl` gives TRL's ``LLM`` our engine with flags.
* Server mode: ``vllm-rl serve`` with ``generation_kwargs={"vllm_xargs": rl_xargs(...)}``,
  and :class:`.client.RLVLLMClient` to keep the records.
"""
from vllm_rl.compat import vllm_version_shim

vllm_version_shim()           # TRL asks importlib for the "vllm" distribution

CHECKED = ("1.16.0",)
