"""``python -m vllm_rl.cli ...``: the same as the ``vllm-rl`` console script."""
import sys

from vllm_rl.cli import main

sys.exit(main())
