"""Give each choice of the OpenAI server its sample's record: ``choices[i].rollout_info``.

Patched internals (``vllm.entrypoints.openai``): ``completion.serving.
OpenAIServingCompletion.request_output_to_completion_response`` and
``.completion_stream_generator``, ``chat_completion.serving.OpenAIServingChat.
chat_completion_full_generator`` and ``.chat_completion_stream_generator``.

Why a patch: vLLM builds each choice from a ``CompletionOutput`` inside these methods,
and a choice has no field for what vLLM does not know.  The front end already gave each
flagged sample's ``CompletionOutput`` its record (``rollout_info``,
``patches/output_processor.py``) and vLLM's own ``stop_reason``; the wrappers copy the
record into the choice built from that output, as a JSON object
(:meth:`vllm_rl.outcome.RolloutInfo.to_json`), an extra field of vLLM's choice models
(``OpenAIBaseModel`` allows them).  Streamed, it rides on the choice's final chunk, the
one with its ``finish_reason``: the wrapper watches the outputs vLLM reads, and re-writes
only a chunk that finishes a choice with a record (once per flagged sample, never per
token).  A request without flags gets vLLM's response unchanged.  ``docs/serving.md``
documents the field.
"""
from __future__ import annotations

import functools
import json
from typing import Any

from . import CHECKED, Patch, PatchMismatch

_COMPLETION = "vllm.entrypoints.openai.completion.serving"
_CHAT = "vllm.entrypoints.openai.chat_completion.serving"
TARGET_FULL = f"{_COMPLETION}.OpenAIServingCompletion.request_output_to_completion_response"
TARGET_STREAM = f"{_COMPLETION}.OpenAIServingCompletion.completion_stream_generator"
TARGET_CHAT_FULL = f"{_CHAT}.OpenAIServingChat.chat_completion_full_generator"
TARGET_CHAT_STREAM = f"{_CHAT}.OpenAIServingChat.chat_completion_stream_generator"
_DATA = "data: "


def _check(source=None) -> None:
    import ast

    from vllm_rl.compat.source import calls

    from . import source_of, target_method

    src = source_of(source)
    full, where = target_method(src, _COMPLETION, "OpenAIServingCompletion",
                                "request_output_to_completion_response", TARGET_FULL,
                                CHECKED, ("self", "final_res_batch", "request"))
    stream, _ = target_method(src, _COMPLETION, "OpenAIServingCompletion",
                              "completion_stream_generator", TARGET_STREAM, CHECKED,
                              ("self", "request", "engine_inputs", "result_generator"))
    chat_full, _ = target_method(src, _CHAT, "OpenAIServingChat",
                                 "chat_completion_full_generator", TARGET_CHAT_FULL, CHECKED,
                                 ("self", "request", "result_generator"))
    chat_stream, _ = target_method(src, _CHAT, "OpenAIServingChat",
                                   "chat_completion_stream_generator", TARGET_CHAT_STREAM,
                                   CHECKED, ("self", "request", "result_generator"))
    shapes = {  # what the wrappers rely on: how each method numbers its choices
        TARGET_FULL: (full, "index=len(choices)"),
        TARGET_STREAM: (stream, "i = output.index + prompt_idx * num_choices"),
        TARGET_CHAT_FULL: (chat_full, "index=output.index"),
        TARGET_CHAT_STREAM: (chat_stream, "i = output.index"),
    }
    for target, (found, shape) in shapes.items():
        module, cls, name = target.rsplit(".", 2)
        text = ast.unparse(found.node)
        if calls(found.node, f"{name}_raw", receiver="self"):     # vLLM 0.33: SSE framing
            text += ast.unparse(src.method(module, cls, f"{name}_raw").node)
        if shape not in text:
            raise PatchMismatch(f"{target} no longer numbers its choices as `{shape}` {where}")
    if "extra='allow'" not in ast.unparse(
            src.cls("vllm.entrypoints.serve.engine.protocol", "OpenAIBaseModel")):
        raise PatchMismatch(f"OpenAIBaseModel no longer allows extra fields {where}")


def _record(output: Any) -> dict | None:
    from vllm_rl.outcome import RECORD_FIELD

    info = getattr(output, RECORD_FIELD, None)
    return None if info is None else info.to_json()


def _with_records(chunk: str, pending: dict[int, dict]) -> str:
    """``chunk`` (one server-sent event) with the pending records of the choices it
    finishes."""
    if not chunk.startswith(_DATA) or '"finish_reason":"' not in chunk:
        return chunk
    from vllm_rl.outcome import RECORD_FIELD

    data = json.loads(chunk[len(_DATA):])
    hit = False
    for choice in data.get("choices") or ():
        record = pending.pop(choice.get("index"), None) if choice.get("finish_reason") \
            else None
        if record is not None:
            choice[RECORD_FIELD] = record
            hit = True
    return f"{_DATA}{json.dumps(data, separators=(',', ':'))}\n\n" if hit else chunk


def _apply() -> None:
    from vllm.entrypoints.openai.chat_completion.serving import OpenAIServingChat
    from vllm.entrypoints.openai.completion.serving import OpenAIServingCompletion

    from vllm_rl.outcome import RECORD_FIELD

    full = OpenAIServingCompletion.request_output_to_completion_response
    stream = OpenAIServingCompletion.completion_stream_generator
    chat_full = OpenAIServingChat.chat_completion_full_generator
    chat_stream = OpenAIServingChat.chat_completion_stream_generator

    @functools.wraps(full)
    def request_output_to_completion_response(self, final_res_batch, request, *args,
                                              **kwargs):
        response = full(self, final_res_batch, request, *args, **kwargs)
        records = [_record(o) for res in final_res_batch for o in res.outputs]
        for choice, record in zip(response.choices, records):
            if record is not None:
                setattr(choice, RECORD_FIELD, record)
        return response

    async def _watch(results, pending: dict[int, dict], width: int | None):
        async for item in results:
            prompt_idx, res = item if width is not None else (0, item)
            for o in res.outputs:
                if o.finish_reason is not None and (record := _record(o)) is not None:
                    pending[o.index + prompt_idx * (width or 0)] = record
            yield item

    @functools.wraps(stream)
    async def completion_stream_generator(self, request, engine_inputs, result_generator,
                                          *args, **kwargs):
        pending: dict[int, dict] = {}
        width = 1 if request.n is None else request.n
        async for chunk in stream(self, request, engine_inputs,
                                  _watch(result_generator, pending, width), *args, **kwargs):
            yield _with_records(chunk, pending) if pending else chunk

    @functools.wraps(chat_full)
    async def chat_completion_full_generator(self, request, result_generator, *args,
                                             **kwargs):
        pending: dict[int, dict] = {}
        response = await chat_full(self, request, _watch(result_generator, pending, None),
                                   *args, **kwargs)
        for choice in getattr(response, "choices", None) or ():
            record = pending.get(choice.index)
            if record is not None:
                setattr(choice, RECORD_FIELD, record)
        return response

    @functools.wraps(chat_stream)
    async def chat_completion_stream_generator(self, request, result_generator, *args,
                                               **kwargs):
        pending: dict[int, dict] = {}
        async for chunk in chat_stream(self, request,
                                       _watch(result_generator, pending, None),
                                       *args, **kwargs):
            yield _with_records(chunk, pending) if pending else chunk

    OpenAIServingCompletion.request_output_to_completion_response = \
        request_output_to_completion_response
    OpenAIServingCompletion.completion_stream_generator = completion_stream_generator
    OpenAIServingChat.chat_completion_full_generator = chat_completion_full_generator
    OpenAIServingChat.chat_completion_stream_generator = chat_completion_stream_generator


class RecordOnChoices(Patch, check=_check, apply=_apply):
    """Each OpenAI choice carries its sample's record (module docstring)."""

    targets = (TARGET_FULL, TARGET_STREAM, TARGET_CHAT_FULL, TARGET_CHAT_STREAM)
