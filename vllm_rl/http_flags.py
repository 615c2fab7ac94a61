"""Reject bad ``vllm_rl`` flags before an HTTP response starts: an ASGI middleware the
endpoint plugin (:mod:`vllm_rl.endpoint`) installs on vLLM's API server.

Why here: the engine-side check (``patches/input_processor.py``) runs when the engine
admits a request.  For a streamed request vLLM has sent its 200 headers by then, so a
bad flag could only come back as an error event inside the stream.  This middleware
reads the JSON body of ``POST /v1/completions`` and ``POST /v1/chat/completions``
(streamed or not) and gives the engine's verdict first: it converts ``vllm_xargs`` and
``n`` with vLLM's own request-model field types (so a JSON ``true`` is the ``1`` the
engine will see), reads the flags with the engine's reader
(:func:`vllm_rl.flags.read`, with the request's ``n``), then runs the checks that depend
on the engine, which the server knows from its ``vllm_config``: DAS flags on an engine
without the drafter or a budget above its b (:func:`vllm_rl.das.config.check_engine`),
and ARRoL flags on an engine without a head (:func:`vllm_rl.arrol.config.check_engine`).
A bad flag gets status 400 and vLLM's own error JSON, built the same way as the engine
side's (``create_error_response(VLLMValidationError(..., parameter="vllm_rl.<flag>"))``):

    {"error": {"message": "vllm_rl flag 'darts.mode': value 'longest' not allowed;
               allowed: one of 'auto', 'dual_end', 'shortest' (parameter=vllm_rl.darts.mode)",
               "type": "BadRequestError", "param": "vllm_rl.darts.mode", "code": 400}}

The nested form (``"vllm_xargs": {"vllm_rl": {...}}``), which vLLM's ``vllm_xargs`` (flat
values only) would refuse, is handed on as its JSON string, the form
:func:`vllm_rl.flags.rl_xargs` builds.  Every other request goes on to vLLM unchanged,
which validates it as it always does (a body that is not JSON, a malformed
``vllm_xargs``); a body without the bytes ``vllm_rl`` is not parsed here at all.  The body is replayed to vLLM message by
message, and later messages of the connection (a client disconnect) still reach vLLM's
cancellation watch.  The engine-side check stays as the second line (the offline
``LLM``, ``AsyncLLM`` users such as verl, and the other routes that take
``vllm_xargs``).

Extension point: ``EndpointPlugin.attach_router`` runs inside vLLM's ``build_app``
before the app starts and before ``init_entrypoints_middleware`` (vLLM 0.32.0 and
0.33.0), so the plugin can ``app.add_middleware``; CORS, ``--api-key`` authentication
and any ``--middleware`` are added later and so run before this one.
"""
from __future__ import annotations

import functools
import json
from collections import deque
from typing import Any

from vllm_rl.flags import KEY

PATHS = ("/v1/completions", "/v1/chat/completions")
_MARK = b"vllm_rl"         # a body without it carries no flags: not parsed here
_REQUEST_MODELS = {        # the route's request model: vLLM's own field types
    "/v1/completions": ("vllm.entrypoints.openai.completion.protocol", "CompletionRequest"),
    "/v1/chat/completions": ("vllm.entrypoints.openai.chat_completion.protocol",
                             "ChatCompletionRequest"),
}


@functools.lru_cache(maxsize=None)
def _adapters(route: str) -> dict[str, Any]:
    """pydantic adapters for the request model's ``n`` and ``vllm_xargs`` fields: the
    conversion vLLM applies to them (a JSON ``true`` in ``vllm_xargs`` becomes ``1``)."""
    import importlib

    from pydantic import TypeAdapter

    module, name = _REQUEST_MODELS.get(route, _REQUEST_MODELS[PATHS[0]])
    fields = getattr(importlib.import_module(module), name).model_fields
    return {key: TypeAdapter(fields[key].annotation) for key in ("n", "vllm_xargs")}


def as_vllm_delivers(body: dict, route: str = PATHS[0]) -> tuple[dict | None, int | None]:
    """``(extra_args, n)`` as vLLM builds them from ``body`` (its request model's own
    conversion of ``vllm_xargs`` and ``n``), or ``(None, None)`` if vLLM will reject the
    body itself.  The nested form (``{"vllm_rl": {...}}``), which ``vllm_xargs`` cannot
    carry, counts as its JSON string: :func:`carry_nested` rewrites it so."""
    xargs = body.get("vllm_xargs")
    if not isinstance(xargs, dict):
        return None, None
    if isinstance(xargs.get(KEY), dict):
        xargs = {**xargs, KEY: _json_form(xargs[KEY])}
    from pydantic import ValidationError

    adapters = _adapters(route)
    try:
        xargs = adapters["vllm_xargs"].validate_python(xargs)
        n = adapters["n"].validate_python(body["n"]) if "n" in body else None
    except ValidationError:
        return None, None
    return xargs, 1 if n is None else n       # n left out: the OpenAI default


def _json_form(section: dict) -> str:
    return json.dumps(section, separators=(",", ":"))


def carry_nested(body: Any) -> Any | None:
    """``body`` with a nested ``vllm_xargs["vllm_rl"]`` mapping replaced by its JSON
    string (the form :func:`vllm_rl.flags.rl_xargs` builds), or None if it has none.
    ``vllm_xargs`` holds only flat values, so vLLM would refuse the mapping."""
    if not isinstance(body, dict) or not isinstance(body.get("vllm_xargs"), dict) \
            or not isinstance(body["vllm_xargs"].get(KEY), dict):
        return None
    xargs = body["vllm_xargs"]
    return {**body, "vllm_xargs": {**xargs, KEY: _json_form(xargs[KEY])}}


def check_body(body: Any, vllm_config: Any = None, route: str = PATHS[0]) -> None:
    """Raise :class:`vllm_rl.flags.FlagError` if an OpenAI request body carries bad
    ``vllm_rl`` flags in ``vllm_xargs``.  The flags are read from what vLLM will deliver
    to the engine (:func:`as_vllm_delivers`), with the engine's own reader
    (:func:`vllm_rl.flags.read`), so this check and the engine's give the same verdict.
    A body vLLM itself will reject (not an object, ``vllm_xargs`` not an object of flat
    values, ``n`` not an integer) is left to vLLM."""
    from vllm_rl.arrol.config import check_engine as check_arrol
    from vllm_rl.das.config import check_engine as check_das
    from vllm_rl.flags import read

    if not isinstance(body, dict):
        return
    extra_args, n = as_vllm_delivers(body, route)
    if extra_args is None:
        return
    flags = read(extra_args, n=n, default_group_id="http-check")
    if flags is not None and vllm_config is not None:
        check_das(flags, vllm_config)
        check_arrol(flags, vllm_config)


def screen(body: bytes, vllm_config: Any = None, route: str = PATHS[0]):
    """``(response, new_body)``: vLLM's 400 JSON response for a body with a bad flag (or
    None), and the body to hand on when it must change (the nested form carried as its
    JSON string; None: unchanged)."""
    from vllm_rl.flags import FlagError

    if _MARK not in body:
        return None, None
    try:
        parsed = json.loads(body)
    except ValueError:                     # not JSON (or not UTF-8): vLLM answers it
        return None, None
    try:
        check_body(parsed, vllm_config, route)
    except FlagError as e:
        from starlette.responses import JSONResponse
        from vllm.entrypoints.serve.exception_handling.error_response import (
            create_error_response)
        from vllm.exceptions import VLLMValidationError

        err = create_error_response(VLLMValidationError(str(e), parameter=f"{KEY}.{e.flag}"))
        return JSONResponse(err.model_dump(), status_code=err.error.code), None
    carried = carry_nested(parsed)
    return None, None if carried is None else json.dumps(carried).encode()


def error_response(body: bytes, vllm_config: Any = None, route: str = PATHS[0]):
    """vLLM's 400 JSON response for a body with a bad flag, or None."""
    return screen(body, vllm_config, route)[0]


def _route(scope) -> str:
    path, root = scope.get("path", ""), scope.get("root_path", "")
    return path[len(root):] if root and path.startswith(root) else path


class FlagCheckMiddleware:
    """Pure ASGI middleware (no ``BaseHTTPMiddleware``: streaming and disconnects pass
    through untouched)."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if (scope["type"] != "http" or scope.get("method") != "POST"
                or _route(scope) not in PATHS):
            return await self.app(scope, receive, send)
        messages: list[dict] = []
        body = bytearray()
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":      # the client left mid-body
                break
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        if messages[-1]["type"] == "http.request":
            state = getattr(scope.get("app"), "state", None)
            response, new_body = screen(bytes(body), getattr(state, "vllm_config", None),
                                        _route(scope))
            if response is not None:
                return await response(scope, receive, send)
            if new_body is not None:       # the nested form, carried as its JSON string
                messages = [{"type": "http.request", "body": new_body, "more_body": False}]
                scope = {**scope, "headers": [
                    (k, str(len(new_body)).encode() if k.lower() == b"content-length" else v)
                    for k, v in scope.get("headers", [])]}
        pending = deque(messages)

        async def replay():
            return pending.popleft() if pending else await receive()

        await self.app(scope, replay, send)
