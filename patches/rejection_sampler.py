"""Fix speculative decoding with random sampling on vLLM's CPU backend.

Patched internal: ``vllm.v1.sample.rejection_sampler.expand_batch_to_tokens`` (CPU only).

Why a patch: the rejection sampler expands each request's temperature, top-k and top-p
to its draft positions with ``expand_batch_to_tokens``.  On the CPU, vLLM 0.32.0 routes
the Triton ``expand_kernel`` to ``vllm.utils.cpu_triton_utils._expand_kernel_impl``,
which converts the output tensor to int64, writes into that temporary copy, and never
copies it back.  The expanded temperatures are therefore uninitialised memory, so every
speculative step with ``temperature > 0`` samples from a garbage distribution (stock
``ngram`` and ``suffix`` included): drafts are almost never accepted and the emitted
tokens are not the model's.  Greedy requests never expand and are unaffected.  The
replacement computes the same expansion with ``repeat_interleave`` (any dtype);
``tests/unit/test_patches.py`` shows the stock function's wrong output and the fixed one.
"""
from __future__ import annotations

import functools

from . import CHECKED, Patch, PatchMismatch

_MODULE = "vllm.v1.sample.rejection_sampler"
TARGET = f"{_MODULE}.expand_batch_to_tokens"
_EXPECTED_PARAMS = ("x", "cu_num_tokens", "num_tokens", "replace_from", "replace_to")


def _module():
    from vllm.v1.sample import rejection_sampler

    return rejection_sampler


def needed() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def _check(source=None) -> None:
    """Fail loudly if vLLM no longer has the shape this patch relies on: the installed
    vLLM, or ``source`` (a :class:`~vllm_rl.compat.source.SourceTree` of any release)."""
    from vllm_rl.compat.source import SourceMissing, name_calls

    from . import source_of, target_function

    src = source_of(source)
    _, where = target_function(src, _MODULE, "expand_batch_to_tokens", TARGET, CHECKED,
                               _EXPECTED_PARAMS)
    try:       # called by its module-global name, which apply() replaces
        user = src.function(_MODULE, "apply_sampling_constraints").node
    except SourceMissing:
        user = None
    if user is None or not name_calls(user, "expand_batch_to_tokens"):
        raise PatchMismatch(f"the rejection sampler no longer expands sampling params "
                            f"with {TARGET} {where}")


def expand(x, cu_num_tokens, num_tokens: int, replace_from=0, replace_to=0):
    """``x[i]`` repeated for each of request i's tokens (``cu_num_tokens`` cumulative),
    with ``replace_from`` values replaced by ``replace_to``: vLLM's definition."""
    import torch

    counts = torch.diff(cu_num_tokens.long(), prepend=cu_num_tokens.new_zeros(1).long())
    x = torch.where(x == replace_from, torch.as_tensor(replace_to, dtype=x.dtype), x)
    return torch.repeat_interleave(x, counts, output_size=num_tokens)


def _apply() -> None:
    if not needed():
        return
    mod = _module()
    original = mod.expand_batch_to_tokens

    @functools.wraps(original)
    def expand_batch_to_tokens(x, cu_num_tokens, num_tokens, replace_from=0, replace_to=0):
        return expand(x, cu_num_tokens, num_tokens, replace_from, replace_to)

    mod.expand_batch_to_tokens = expand_batch_to_tokens


class CpuSpecExpand(Patch, check=_check, apply=_apply):
    """vLLM's CPU expansion of sampling params to draft tokens fixed (module docstring)."""

    targets = (TARGET,)
