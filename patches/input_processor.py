"""Check and canonicalize ``vllm_rl`` flags when a request is submitted.

Patched internal: ``vllm.v1.engine.input_processor.InputProcessor.process_inputs``.

Why a patch: vLLM validates ``SamplingParams`` at admission, but its only hook for
extra checks (a custom logits processor's ``validate_params``) also switches off
speculative decoding, which DAS needs.  The wrapper runs before vLLM's own body and
reads the flags with the one reader (:func:`vllm_rl.flags.read`, the request's ``n``),
so a bad flag raises ``VLLMValidationError`` (HTTP 400 on the server) naming the flag, the
request never reaches the engine, and every other request goes on.  After vLLM's body
it writes the canonical flags (:meth:`vllm_rl.flags.RLFlags.canonical`: defaults
filled, a group id for a group sent as one request, the DAS problem id of a prompt-keyed
request) into the request's own copy of the params, before ``n > 1`` fans out; the
engine reads that form once per request.  Flags the engine cannot serve (DAS on an engine
started without its drafter, a budget above the engine's) are rejected the same way.
"""
from __future__ import annotations

import functools
import uuid

from . import CHECKED, Patch, PatchMismatch

TARGET = "vllm.v1.engine.input_processor.InputProcessor.process_inputs"
_EXPECTED_PARAMS = ("self", "request_id", "prompt", "params")


def _target():
    from vllm.v1.engine.input_processor import InputProcessor

    return InputProcessor


def _check(source=None) -> None:
    """Fail loudly if vLLM no longer has the shape this patch relies on: the installed
    vLLM, or ``source`` (a :class:`~vllm_rl.compat.source.SourceTree` of any release)."""
    import ast

    from vllm_rl.compat.source import SourceMissing, assignments, calls, is_attr, name_calls

    from . import source_of, target_method

    src = source_of(source)
    fn, where = target_method(src, "vllm.v1.engine.input_processor", "InputProcessor",
                              "process_inputs", TARGET, CHECKED, _EXPECTED_PARAMS)
    if not any(is_attr(c.func, "params", "clone") for c in calls(fn.node, "clone")):
        raise PatchMismatch(f"{TARGET} no longer gives the request its own params {where}")
    # AsyncLLM's raw prompts go through process_inputs_async: it must run process_inputs.
    for node in ast.walk(src.cls("vllm.v1.engine.input_processor", "InputProcessor")):
        if isinstance(node, ast.Assign) and any(ast.unparse(t) == "self.process_inputs_async"
                                                for t in node.targets):
            via = any(is_attr(n, "self", "process_inputs") for n in ast.walk(node.value))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                and node.name == "process_inputs_async":
            via = bool(calls(node, "process_inputs", receiver="self"))
        else:
            continue
        if not via:
            raise PatchMismatch(f"InputProcessor.process_inputs_async no longer runs "
                                f"{TARGET} {where}")
    # n > 1 fans out from the processed request's own params (where the flags were put).
    for module, cls in (("vllm.v1.engine.llm_engine", "LLMEngine"),
                        ("vllm.v1.engine.async_llm", "AsyncLLM")):
        try:
            add = src.method(module, cls, "add_request").node
        except SourceMissing:
            raise PatchMismatch(f"{module}.{cls}.add_request is gone {where}") from None
        processed = [c.lineno for c in calls(add, "process_inputs", "self.input_processor")
                     + calls(add, "process_inputs_async", "self.input_processor")]
        fan = [a.lineno for a in assignments(add, "params")
               if is_attr(a.value, "request", "params")]
        parent = [c.lineno for c in name_calls(add, "ParentRequest")
                  if c.args and ast.unparse(c.args[0]) in ("request", "params")]
        if not any(p < f < q for p in processed for f in fan for q in parent):
            raise PatchMismatch(f"{module}.{cls}.add_request no longer fans out n > 1 from "
                                f"the processed params (params = request.params, then "
                                f"ParentRequest(request)) {where}")


def _apply() -> None:
    cls = _target()
    original = cls.process_inputs

    @functools.wraps(original)
    def process_inputs(self, request_id, prompt, params, *args, **kwargs):
        from vllm.exceptions import VLLMValidationError
        from vllm.sampling_params import SamplingParams

        from vllm_rl.flags import KEY, FlagError, read
        from vllm_rl.arrol.config import check_engine as check_arrol
        from vllm_rl.das.config import check_engine, default_problem_id

        if not isinstance(params, SamplingParams) or not params.extra_args:
            return original(self, request_id, prompt, params, *args, **kwargs)
        group_id = f"{request_id}-{uuid.uuid4().hex[:8]}"
        try:
            flags = read(params.extra_args, n=params.n, default_group_id=group_id)
            if flags is None:
                return original(self, request_id, prompt, params, *args, **kwargs)
            flags = check_arrol(check_engine(flags, self.vllm_config), self.vllm_config)
        except FlagError as e:
            raise VLLMValidationError(str(e), parameter=f"{KEY}.{e.flag}") from e
        request = original(self, request_id, prompt, params, *args, **kwargs)
        canonical = flags.canonical()
        if "das" in canonical and canonical["das"]["problem_id"] is None:
            named = None if flags.group is None or flags.group.id == group_id \
                else flags.group.id
            prompt = request.prompt_token_ids
            if flags.partial is not None and flags.partial.prior_tokens and prompt:
                prompt = prompt[:len(prompt) - flags.partial.prior_tokens]  # a continuation
            canonical["das"]["problem_id"] = default_problem_id(named, prompt)
        own = request.sampling_params
        own.extra_args = {k: v for k, v in own.extra_args.items() if not k.startswith(KEY)}
        own.extra_args[KEY] = canonical
        return request

    cls.process_inputs = process_inputs


class FlagsAdmission(Patch, check=_check, apply=_apply):
    """Flags read, checked and made canonical at admission (module docstring)."""

    targets = (TARGET,)
