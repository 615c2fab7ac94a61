"""Keep a sample's record when vLLM merges its streamed outputs.

Patched internal: ``vllm.outputs.RequestOutput.add``.

Why a patch: ``AsyncLLM`` hands a streaming consumer that fell behind one merged
``RequestOutput`` (``RequestOutputCollector``: ``add(next, aggregate=True)``), which
copies the next output's fields into the earlier ``CompletionOutput`` object, vLLM's
own fields only.  A final output's record (``rollout_info``,
``patches/output_processor.py``) would be lost with the object it came on.  The wrapper
carries it over; a merge without records costs one pass over the next output's
completions.
"""
from __future__ import annotations

import functools

from . import CHECKED, Patch, PatchMismatch

TARGET = "vllm.outputs.RequestOutput.add"


def _check(source=None) -> None:
    import ast

    from . import source_of, target_method

    src = source_of(source)
    add, where = target_method(src, "vllm.outputs", "RequestOutput", "add", TARGET, CHECKED,
                               ("self", "next_output", "aggregate"))
    if "completion.stop_reason = next_completion.stop_reason" not in ast.unparse(add.node):
        raise PatchMismatch(f"{TARGET} no longer merges a completion's fields into the "
                            f"earlier CompletionOutput {where}")


def _apply() -> None:
    from vllm.outputs import RequestOutput

    from vllm_rl.outcome import RECORD_FIELD

    original = RequestOutput.add

    @functools.wraps(original)
    def add(self, next_output, aggregate, *args, **kwargs):
        carried = {c.index: info for c in next_output.outputs
                   if (info := getattr(c, RECORD_FIELD, None)) is not None}
        original(self, next_output, aggregate, *args, **kwargs)
        if carried:
            for c in self.outputs:
                info = carried.get(c.index)
                if info is not None:
                    setattr(c, RECORD_FIELD, info)

    RequestOutput.add = add


class RecordMerge(Patch, check=_check, apply=_apply):
    """A streamed sample's record survives vLLM's merge of its outputs (module docstring)."""

    targets = (TARGET,)
