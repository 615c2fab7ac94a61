"""The task kit: the embedded model, its prompt sets and its verifier.

``MODEL_PATH`` is a Qwen3-architecture causal LM (head_dim 64, ~3.5M parameters) trained
by :mod:`vllm_rl.task.train` on the synthetic task of :mod:`vllm_rl.task.problems`.
"""
from pathlib import Path

from vllm_rl.task.problems import (Problem, extract_answer, heldout_prompts, heldout_problems,
                                   reward, train_prompts, train_problems)

MODEL_PATH = Path(__file__).resolve().parent / "model"

__all__ = ["MODEL_PATH", "Problem", "extract_answer", "heldout_prompts", "heldout_problems",
           "reward", "train_prompts", "train_problems"]
