"""HTTP routes of the RL engine's server: a ``vllm.endpoint_plugins`` entry point.

- one route per RPC of the table (:data:`vllm_rl.rpc.METHODS`): ``POST /vllm_rl/arrol``
  loads ARRoL head weights and/or a calibration (``arrol_update``), ``GET /vllm_rl/arrol``
  returns the head's version, shape, calibration and counts; ``POST /vllm_rl/das/prebuild``
  fills a problem's DAS tree with past rollouts (token ids, or texts the server
  tokenizes), ``POST /vllm_rl/das/clear`` drops one tree or all, ``GET /vllm_rl/das/stats``
  and ``GET /vllm_rl/das/phase`` report (``vllm_rl.LLM.das_*``); ``POST
  /vllm_rl/arrol/hidden`` with ``{"request_ids": [...]}`` (the records' ``hidden_id``)
  takes the hidden states at ``l_detect`` the workers kept (``arrol.return_hidden``):
  ``{"hidden": {id: base64 of float32 little-endian}}``, ids not kept absent
  (:func:`vllm_rl.outcome.decode_hidden`).  Off the per-step path: only on request.
- ``POST /vllm_rl/reload_weights`` reloads the model's weights in place from disk (the
  served checkpoint, or ``{"path": ...}``: a local folder, same architecture) through the
  worker's own ``reload_weights``, then the weight sync's cache side
  (:func:`vllm_rl.weights.weight_sync_async`): the prefix cache reset with every request
  holding KV recomputed on the new weights, so none reads KV of the old ones.  DAS
  trees and the ARRoL head stay.  Requests in flight: ``"mode": "wait"`` (default) lets
  them finish on the old weights first, ``"abort"`` ends them (finish reason
  ``abort``), ``"keep"`` continues them on the new weights, their KV recomputed (vLLM's
  ``pause_generation`` modes).  The answer carries the engine's report under
  ``"cache"`` (weight version, cached blocks dropped, requests recomputed), and
  ``vllm_rl:weight_syncs_total`` / ``vllm_rl:weight_sync_requests_recomputed_total``
  count it on ``/metrics``.  ``"reset_prefix_cache": false`` is refused (400): it would
  serve KV of the old weights.  Requests that arrive
  during the reload are parked and served on the new weights, never refused (vLLM 0.33's
  own ``pause_generation`` answers them 503; :func:`vllm_rl.weights.pause_parked`).
- ``POST /vllm_rl/end_step`` with ``{"step": N}`` ends trainer step N now (partial
  rollouts driven over HTTP: the trainer counts the step's complete groups itself; the
  engine-core utility ``vllm_rl_end_step``, :mod:`vllm_rl.end_step`): its samples still
  generating come back ``carried``.  ``{"step": N, "live": k}``: k of its samples were
  live (0 for a step the engine does not hold).  A step that is not an int >= 0 is a 400
  naming ``partial.step``, as the flag reader refuses it.
- ``POST /v1/completions`` and ``POST /v1/chat/completions`` (vLLM's own routes) get
  :class:`vllm_rl.http_flags.FlagCheckMiddleware`: a bad ``vllm_rl`` flag is an HTTP 400
  before the response starts, streamed or not.

The engine side is the worker extension (:mod:`vllm_rl.worker`, installed with the
engine) and vLLM's worker; this plugin only exposes them.  vLLM loads endpoint plugins
only when ``VLLM_PLUGINS`` names them; ``vllm-rl serve`` adds ``vllm_rl`` to it.

    curl -X POST localhost:8000/vllm_rl/arrol -d '{"calibration": {...}}'
    {"version": 3}
"""

import json
import time
from typing import Any

# (no `from __future__ import annotations`: FastAPI reads the route annotations at runtime)
from vllm_rl.rpc import METHODS, Method

RELOAD_MODES = ("wait", "abort", "keep")   # vLLM's pause_generation modes for requests in flight


def _token_ids(client, value) -> list[int]:
    """Token ids as given, or a text tokenized with the served model's tokenizer."""
    if isinstance(value, str):
        return list(client.get_tokenizer().encode(value, add_special_tokens=False))
    if not isinstance(value, list) or not all(isinstance(t, int) for t in value):
        raise ValueError("a rollout or prompt is a list of token ids or a string")
    return value


def _check_weights_dir(path) -> None:
    """A reload path must be a local folder with weight files (no hub ids: the worker
    would download, and vLLM's reload takes the engine down when it fails)."""
    if path is None:
        return
    from pathlib import Path

    folder = Path(str(path))
    if not folder.is_dir():
        raise ValueError(f"path {str(path)!r}: not a folder on the server")
    if not any(any(folder.glob(p)) for p in ("*.safetensors", "*.bin", "*.pt")):
        raise ValueError(f"path {str(path)!r}: no *.safetensors / *.bin / *.pt weight files")


def _route(method: Method, read_body, error):
    """The HTTP handler of one RPC: body keys checked, texts tokenized (``das_prebuild``),
    arguments prepared and checked as on every other path, and against the served
    engine's config (:meth:`vllm_rl.rpc.Method.engine_call_args`: a bad ARRoL update is a
    400 here, with no worker traceback), ``collective_rpc``, rank 0's result (as JSON:
    ``method.to_json``; under ``method.result_key``)."""
    from fastapi import Request

    async def handler(raw: Request):
        client = raw.app.state.engine_client
        body = {}
        if method.http[0] == "POST":
            body, err = await read_body(raw, method.params + method.http_extra, method.required)
            if err:
                return err
        try:
            if method.name == "das_prebuild":
                body = {**body, "rollouts": [_token_ids(client, r) for r in body["rollouts"]]}
                if body.get("prompt_token_ids") is None and body.get("prompt") is not None:
                    body["prompt_token_ids"] = _token_ids(client, body["prompt"])
            # checked here, against the engine's config (an ARRoL head's keys, shapes,
            # dtype and hidden size): a bad update is a 400 before any worker sees it
            args = method.engine_call_args(
                getattr(raw.app.state, "vllm_config", None),
                **{k: v for k, v in body.items() if k in method.params})
        except Exception as e:        # bad ids, a bad head or calibration, no head
            return error(400, f"{method.name}: {e}")
        try:
            result = method.result(await client.collective_rpc(method.name, args=args))
        except Exception as e:        # no drafter on this engine, a head file gone since
            return error(400, f"{method.name}: {e}")
        if method.to_json is not None:
            result = method.to_json(result)
        if method.result_key is None:
            return result
        out = {method.result_key: result}
        if method.name == "das_prebuild":
            out = {"problem_id": str(body["problem_id"]), **out}
        return out

    handler.__name__ = method.name
    return handler


class RLEndpoints:
    """The plugin object vLLM instantiates (``EndpointPlugin`` protocol)."""

    name = "vllm_rl"
    required_tasks = None

    def attach_router(self, app) -> None:
        from fastapi import APIRouter, Request
        from fastapi.responses import JSONResponse

        from vllm_rl.http_flags import FlagCheckMiddleware

        # build_app calls this before the app starts: middleware may still be added
        app.add_middleware(FlagCheckMiddleware)
        router = APIRouter()

        def _error(status: int, message: str):
            return JSONResponse({"error": {"message": message, "code": status}},
                                status_code=status)

        async def _body(raw: Request, keys: tuple[str, ...], required: tuple[str, ...] = ()):
            """The JSON object of a request (empty body: {}), or an error response."""
            data = await raw.body()
            try:
                body: Any = json.loads(data) if data.strip() else {}
            except ValueError:
                return None, _error(400, "body: a JSON object")
            if not isinstance(body, dict) or set(body) - set(keys) or set(required) - set(body):
                return None, _error(400, f"body: a JSON object with keys among {list(keys)}"
                                         + (f", {list(required)} required" if required else ""))
            return body, None

        for method in METHODS:                # one route per RPC of the table
            router.add_api_route(method.http[1], _route(method, _body, _error),
                                 methods=[method.http[0]], name=method.name)

        @router.post("/vllm_rl/reload_weights")
        async def reload_weights(raw: Request):
            body, err = await _body(raw, ("path", "reset_prefix_cache", "mode"))
            if err:
                return err
            client = raw.app.state.engine_client
            mode = body.get("mode", "wait")
            if mode not in RELOAD_MODES:
                return _error(400, f"reload_weights: mode {mode!r}: allowed {list(RELOAD_MODES)}")
            if body.get("reset_prefix_cache", True) is not True:
                return _error(400, "reload_weights: reset_prefix_cache must be true (the "
                                   "cache's KV was computed with the old weights)")
            try:            # vLLM's reload kills the engine on a bad path: check it here
                _check_weights_dir(body.get("path"))
            except ValueError as e:
                return _error(400, f"reload_weights: {e}")
            from vllm_rl.metrics import observe_weight_sync
            from vllm_rl.weights import pause_parked, weight_sync_async

            t0 = time.perf_counter()
            await pause_parked(client, mode)     # arrivals wait for the resume, no 503
            try:
                await client.collective_rpc("reload_weights",
                                            kwargs={"weights_path": body.get("path")})
                cache = await weight_sync_async(client)
            except Exception as e:        # a missing path, another architecture
                return _error(400, f"reload_weights: {e}")
            finally:
                await client.resume_generation()
            observe_weight_sync(mode, cache)
            return {"reloaded": True, "path": body.get("path"), "mode": mode, "cache": cache,
                    "seconds": round(time.perf_counter() - t0, 3)}

        @router.post("/vllm_rl/end_step")
        async def end_step(raw: Request):
            body, err = await _body(raw, ("step",), ("step",))
            if err:
                return err
            from vllm_rl.end_step import end_step_async
            from vllm_rl.flags import FlagError, read_step

            try:
                step = read_step(body["step"])
            except FlagError as e:
                return _error(400, f"end_step: {e}")
            try:
                live = await end_step_async(raw.app.state.engine_client, step)
            except Exception as e:        # an engine that does not run the RL scheduler
                return _error(400, f"end_step: {e}")
            return {"step": step, "live": live}

        app.include_router(router)

    async def init_state(self, engine_client, state, args) -> None:
        return None
