"""Give a ``custom_class`` proposer the step it drafts for (request ids and flags).

Patched internal: ``vllm.v1.worker.gpu_model_runner.GPUModelRunner.propose_draft_token_ids``
(the CPU model runner inherits it, so the same patch serves both).

Why a patch: vLLM's ``custom_class`` interface calls ``propose(sampled_token_ids,
num_tokens_no_spec, token_ids_cpu, ...)`` with token arrays only.  DAS drafts from the
tree of each request's *problem*, with a budget from the request's *flags*, so it needs
the row -> request mapping and each request's ``SamplingParams``.  The wrapper calls
``drafter.bind_step(runner, scheduler_output)`` before vLLM's own body when the drafter
defines it (DAS's does; any other proposer is untouched) and changes nothing else.
"""
from __future__ import annotations

import functools
import inspect

from . import PatchMismatch, checked_target

TARGET = "vllm.v1.worker.gpu_model_runner.GPUModelRunner.propose_draft_token_ids"
CHECKED = ("0.32.0",)
_EXPECTED_PARAMS = ("self", "scheduler_output", "sampled_token_ids")


def _target():
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    return GPUModelRunner


def check() -> None:
    """Fail loudly if vLLM no longer has the shape this patch relies on."""
    fn, where = checked_target(_target(), "propose_draft_token_ids", TARGET, CHECKED,
                               _EXPECTED_PARAMS)
    src = inspect.getsource(fn)
    if 'method == "custom_class"' not in src or "self.drafter).propose(" not in src:
        raise PatchMismatch(f"{TARGET} no longer calls a custom_class drafter's "
                            f"propose() {where}")
    from vllm.v1.worker.gpu_input_batch import InputBatch

    if "req_ids" not in inspect.getsource(InputBatch):
        raise PatchMismatch(f"InputBatch has no req_ids {where}")


def apply() -> None:
    cls = _target()
    original = cls.propose_draft_token_ids
    if getattr(original, "_vllm_rl_patched", False):
        return

    @functools.wraps(original)
    def propose_draft_token_ids(self, scheduler_output, *args, **kwargs):
        bind = getattr(getattr(self, "drafter", None), "bind_step", None)
        if bind is not None:
            bind(self, scheduler_output)
        return original(self, scheduler_output, *args, **kwargs)

    propose_draft_token_ids._vllm_rl_patched = True
    cls.propose_draft_token_ids = propose_draft_token_ids
