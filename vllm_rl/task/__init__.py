"""The task kits: the embedded models, their prompt sets and their verifier.

Two kits, each selected by one name (:func:`kit`, ``--task`` in the benchmarks):
``arith`` (:data:`MODEL_PATH`, the first: a Qwen3-architecture causal LM, head_dim 64,
~3.5M parameters, trained by :mod:`vllm_rl.task.train` on the task of
:mod:`vllm_rl.task.problems`) and ``reasoning`` (the same architecture warm-started from
it and trained on the reasoning traces of :mod:`vllm_rl.task.reasoning`).  See
:mod:`vllm_rl.task.kits`.
"""
from vllm_rl.task.kits import KITS, Kit, kit
from vllm_rl.task.problems import (Problem, extract_answer, heldout_prompts, heldout_problems,
                                   reward, train_prompts, train_problems)

MODEL_PATH = KITS["arith"].model_path

__all__ = ["KITS", "Kit", "MODEL_PATH", "Problem", "extract_answer", "heldout_prompts",
           "heldout_problems", "kit", "reward", "train_prompts", "train_problems"]
