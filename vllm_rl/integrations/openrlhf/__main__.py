"""``python -m vllm_rl.integrations.openrlhf <train_ppo_ray args>``: OpenRLHF's PPO
trainer with its rollout engines on the RL engine (:mod:`.launcher`)."""
import sys

from vllm_rl.integrations.openrlhf.launcher import main

if __name__ == "__main__":
    sys.exit(main())
