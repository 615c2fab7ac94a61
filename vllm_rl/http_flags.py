"""Reject bad ``vllm_rl`` flags before an HTTP response starts: an ASGI middleware the
endpoint plugin (:mod:`vllm_rl.endpoint`) installs on vLLM's API server.

Why here: the engine-side check (``patches/flags_admission.py``) runs when the engine
admits a request.  For a streamed request vLLM has sent its 200 headers by then, so a
bad flag could only come back as an error event inside the stream.  This middleware
reads the JSON body of ``POST /v1/completions`` and ``POST /v1/chat/completions``
(streamed or not) and runs the same checks first: :func:`vllm_rl.flags.extract` and
:func:`~vllm_rl.flags.normalize` with the request's ``n``, then the checks that depend
on the engine, which the server knows from its ``vllm_config``: DAS flags on an engine
without the drafter or a budget above its b (:func:`vllm_rl.das.config.check_engine`),
and ARRoL flags on an engine without a head (:func:`vllm_rl.arrol.config.check_engine`).
A bad flag gets status 400 and vLLM's own error JSON, built the same way as the engine
side's (``create_error_response(VLLMValidationError(..., parameter="vllm_rl.<flag>"))``):

    {"error": {"message": "vllm_rl flag 'darts.mode': value 'longest' not allowed;
               allowed: one of 'auto', 'dual_end', 'shortest' (parameter=vllm_rl.darts.mode)",
               "type": "BadRequestError", "param": "vllm_rl.darts.mode", "code": 400}}

Every other request goes on to vLLM unchanged, which validates it as it always does (a
body that is not JSON, a malformed ``vllm_xargs``); a body without the bytes
``vllm_rl`` is not parsed here at all.  The body is replayed to vLLM message by
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

import json
from collections import deque
from typing import Any

PATHS = ("/v1/completions", "/v1/chat/completions")
_MARK = b"vllm_rl"         # a body without it carries no flags: not parsed here


def check_body(body: Any, vllm_config: Any = None) -> None:
    """Raise :class:`vllm_rl.flags.FlagError` if an OpenAI request body carries bad
    ``vllm_rl`` flags in ``vllm_xargs``.  A body vLLM itself will reject (not an object,
    ``vllm_xargs`` not an object, ``n`` not an integer) is left to vLLM."""
    from vllm_rl.arrol.config import check_engine as check_arrol
    from vllm_rl.flags import extract, normalize
    from vllm_rl.das.config import check_engine as check_das

    if not isinstance(body, dict) or not isinstance(body.get("vllm_xargs"), dict):
        return
    raw = extract(body["vllm_xargs"])
    if raw is None:
        return
    n = body.get("n")
    if n is None:
        n = 1                              # the OpenAI default, as vLLM's protocol
    elif isinstance(n, float) and n.is_integer():
        n = int(n)                         # pydantic's lax int
    if isinstance(n, bool) or not isinstance(n, int):
        return
    canonical = normalize(raw, n=n, default_group_id="http-check")
    if vllm_config is not None:
        check_das(canonical, vllm_config)
        check_arrol(canonical, vllm_config)


def error_response(body: bytes, vllm_config: Any = None):
    """vLLM's 400 JSON response for a body with a bad flag, or None."""
    from vllm_rl.flags import KEY, FlagError

    if _MARK not in body:
        return None
    try:
        parsed = json.loads(body)
    except ValueError:                     # not JSON (or not UTF-8): vLLM answers it
        return None
    try:
        check_body(parsed, vllm_config)
    except FlagError as e:
        from starlette.responses import JSONResponse
        from vllm.entrypoints.serve.exception_handling.error_response import (
            create_error_response)
        from vllm.exceptions import VLLMValidationError

        err = create_error_response(VLLMValidationError(str(e), parameter=f"{KEY}.{e.flag}"))
        return JSONResponse(err.model_dump(), status_code=err.error.code)
    return None


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
            response = error_response(bytes(body), getattr(state, "vllm_config", None))
            if response is not None:
                return await response(scope, receive, send)
        pending = deque(messages)

        async def replay():
            return pending.popleft() if pending else await receive()

        await self.app(scope, replay, send)
