"""Seeded requests survive a chunked prefill on the CPU (vLLM 0.32.0's CPU runner).

Patched internal: ``vllm.v1.worker.gpu_input_batch.InputBatch.add_request`` (the CPU
model runner's batch is the same class).

Why a patch: when a request's sampled token is discarded (its prefill is chunked, as
when a preempted request recomputes its prompt and tokens), ``GPUModelRunner.
_bookkeeping_sync`` rewinds the request's own generator with
``gen.set_offset(gen.get_offset() - 4)``.  A CUDA generator has a Philox offset; a CPU
one raises ``RuntimeError: CPU Generator does not use offset``, and the engine dies.
Any request with a ``seed`` whose prefill is chunked hits it on the CPU, and every
weight sync recomputes the requests in flight (``RLSchedulerMixin.reset_prefix_cache``).
The wrapper gives a seeded request on the CPU a generator whose offset calls do nothing
(:class:`CPUGenerator`, same state): the discarded token's draw is not rewound, so its
later tokens are drawn from the stream's next numbers, not the ones a GPU would reuse.
Each token is still one draw from the model's distribution; only the seeded sequence
then depends on how the prefill was chunked.  A CUDA generator is untouched.
"""
from __future__ import annotations

import functools

from . import CHECKED, Patch, PatchMismatch

_MODULE = "vllm.v1.worker.gpu_input_batch"
TARGET = f"{_MODULE}.InputBatch.add_request"
_EXPECTED_PARAMS = ("self", "request")


def _target():
    from vllm.v1.worker.gpu_input_batch import InputBatch

    return InputBatch


def _check(source=None) -> None:
    """Fail loudly if vLLM no longer keeps a request's generator as this patch expects:
    the installed vLLM, or ``source`` (a :class:`~vllm_rl.compat.source.SourceTree`)."""
    import ast

    from . import source_of, target_method

    src = source_of(source)
    fn, where = target_method(src, _MODULE, "InputBatch", "add_request", TARGET, CHECKED,
                              _EXPECTED_PARAMS)
    keeps = [n for n in ast.walk(fn.node) if isinstance(n, ast.Assign)
             and ast.unparse(n.value) == "request.generator"
             and any(ast.unparse(t).startswith("self.generators[") for t in n.targets)]
    if not keeps:
        raise PatchMismatch(f"{TARGET} no longer stores request.generator in "
                            f"self.generators {where}")


def _cpu_generator_class():
    import torch

    class CPUGenerator(torch.Generator):
        """A CPU generator that ignores Philox offsets (module docstring)."""

        def get_offset(self) -> int:
            return 0

        def set_offset(self, offset: int) -> "CPUGenerator":
            return self

    return CPUGenerator


def _apply() -> None:
    cls = _target()
    original = cls.add_request
    cpu_generator = _cpu_generator_class()

    @functools.wraps(original)
    def add_request(self, request, *args, **kwargs):
        gen = request.generator
        if gen is not None and gen.device.type == "cpu" and type(gen) is not cpu_generator:
            wrapped = cpu_generator(device="cpu")
            wrapped.set_state(gen.get_state())
            request.generator = wrapped
        return original(self, request, *args, **kwargs)

    cls.add_request = add_request


class CpuSeededChunks(Patch, check=_check, apply=_apply):
    """Seeded CPU generators kept whole across chunks (module docstring)."""

    targets = (TARGET,)
