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

from .. import CHECKED, Patch, PatchMismatch

_MODULE = "vllm.v1.worker.gpu_model_runner"
TARGET = f"{_MODULE}.GPUModelRunner.propose_draft_token_ids"
_EXPECTED_PARAMS = ("self", "scheduler_output", "sampled_token_ids")


def _target():
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    return GPUModelRunner


def _check(source=None) -> None:
    """Fail loudly if vLLM no longer has the shape this patch relies on: the installed
    vLLM, or ``source`` (a :class:`~vllm_rl.compat.source.SourceTree` of any release)."""
    import ast

    from vllm_rl.compat.source import calls

    from .. import source_of, target_method

    src = source_of(source)
    fn, where = target_method(src, _MODULE, "GPUModelRunner", "propose_draft_token_ids",
                              TARGET, CHECKED, _EXPECTED_PARAMS)
    custom = [n for n in ast.walk(fn.node) if isinstance(n, ast.If)
              and isinstance(n.test, ast.Compare) and isinstance(n.test.left, ast.Attribute)
              and n.test.left.attr == "method" and isinstance(n.test.ops[0], ast.Eq)
              and any(isinstance(c, ast.Constant) and c.value == "custom_class"
                      for c in n.test.comparators)]
    if not any("self.drafter" in ast.unparse(c.func.value)
               for branch in custom for c in calls(branch.body, "propose")):
        raise PatchMismatch(f"{TARGET} no longer calls a custom_class drafter's "
                            f"propose() {where}")
    runner = src.cls(_MODULE, "GPUModelRunner")
    if not calls(runner, "propose_draft_token_ids", receiver="self"):
        raise PatchMismatch(f"GPUModelRunner no longer drafts through "
                            f"self.propose_draft_token_ids() {where}")
    cpu = src.method("vllm.v1.worker.cpu_model_runner", "CPUModelRunner",
                     "propose_draft_token_ids")
    if not cpu.owner.endswith(".GPUModelRunner"):
        raise PatchMismatch(f"{cpu.owner} overrides {TARGET} {where}")
    if "req_ids" not in src.fields("vllm.v1.worker.gpu_input_batch", "InputBatch"):
        raise PatchMismatch(f"InputBatch has no req_ids {where}")


def _apply() -> None:
    cls = _target()
    original = cls.propose_draft_token_ids

    @functools.wraps(original)
    def propose_draft_token_ids(self, scheduler_output, *args, **kwargs):
        bind = getattr(getattr(self, "drafter", None), "bind_step", None)
        if bind is not None:
            bind(self, scheduler_output)
        return original(self, scheduler_output, *args, **kwargs)

    cls.propose_draft_token_ids = propose_draft_token_ids


class DasProposerContext(Patch, check=_check, apply=_apply):
    """The DAS drafter bound to the step it drafts for (module docstring)."""

    targets = (TARGET,)
