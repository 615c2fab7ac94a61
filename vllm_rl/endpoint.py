"""HTTP routes of the RL engine's server: a ``vllm.endpoint_plugins`` entry point.

- ``POST /vllm_rl/arrol`` loads ARRoL head weights and/or a calibration into the running
  server (the same as ``vllm_rl.LLM.arrol_update``); ``GET /vllm_rl/arrol`` returns the
  head's version, shape, calibration and counts.
- ``POST /vllm_rl/das/prebuild`` fills a problem's DAS tree with past rollouts (token ids,
  or texts the server tokenizes); ``POST /vllm_rl/das/clear`` drops one tree or all;
  ``GET /vllm_rl/das/stats`` gives trees, memory and acceptance (``vllm_rl.LLM.das_*``).
- ``POST /vllm_rl/reload_weights`` reloads the model's weights in place from disk (the
  served checkpoint, or ``{"path": ...}``: a local folder, same architecture) through the
  worker's own ``reload_weights``, then resets the prefix cache.  DAS trees and the ARRoL
  head stay.  Requests in flight: ``"mode": "wait"`` (default) lets them finish on the
  old weights first, ``"abort"`` ends them (finish reason ``abort``), ``"keep"`` continues
  them on the new weights (vLLM's ``pause_generation`` modes).  Requests that arrive
  during the reload are parked and served on the new weights, never refused (vLLM 0.33's
  own ``pause_generation`` answers them 503; :func:`vllm_rl.weights.pause_parked`).
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
UPDATE_KEYS = ("head", "calibration", "cold_start", "version")
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

        @router.post("/vllm_rl/arrol")
        async def arrol_update(raw: Request):
            try:
                body: Any = await raw.json()
            except ValueError:
                return _error(400, "body: a JSON object")
            if not isinstance(body, dict) or set(body) - set(UPDATE_KEYS):
                return _error(400, f"body: a JSON object with keys among {list(UPDATE_KEYS)}")
            args = tuple(body.get(k, False if k == "cold_start" else None) for k in UPDATE_KEYS)
            try:
                version = (await raw.app.state.engine_client.collective_rpc(
                    "arrol_update", args=args))[0]
            except Exception as e:        # a bad head or calibration, or no ARRoL head
                return _error(400, f"arrol_update: {e}")
            return {"version": version}

        @router.get("/vllm_rl/arrol")
        async def arrol_info(raw: Request):
            try:
                return (await raw.app.state.engine_client.collective_rpc("arrol_info"))[0]
            except Exception as e:
                return _error(400, f"arrol_info: {e}")

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

        @router.post("/vllm_rl/das/prebuild")
        async def das_prebuild(raw: Request):
            body, err = await _body(raw, ("problem_id", "rollouts", "prompt",
                                          "prompt_token_ids"), ("problem_id", "rollouts"))
            if err:
                return err
            client = raw.app.state.engine_client
            try:
                rollouts = [_token_ids(client, r) for r in body["rollouts"]]
                prompt = body.get("prompt_token_ids")
                if prompt is None and body.get("prompt") is not None:
                    prompt = _token_ids(client, body["prompt"])
                added = (await client.collective_rpc(
                    "das_prebuild", args=(str(body["problem_id"]), rollouts, prompt)))[0]
            except Exception as e:        # no drafter, bad token ids
                return _error(400, f"das_prebuild: {e}")
            return {"problem_id": str(body["problem_id"]), "rollouts": added}

        @router.post("/vllm_rl/das/clear")
        async def das_clear(raw: Request):
            body, err = await _body(raw, ("problem_id",))
            if err:
                return err
            try:
                dropped = (await raw.app.state.engine_client.collective_rpc(
                    "das_clear", args=(body.get("problem_id"),)))[0]
            except Exception as e:
                return _error(400, f"das_clear: {e}")
            return {"dropped": dropped}

        @router.get("/vllm_rl/das/stats")
        async def das_stats(raw: Request):
            try:
                return (await raw.app.state.engine_client.collective_rpc("das_stats"))[0]
            except Exception as e:
                return _error(400, f"das_stats: {e}")

        @router.post("/vllm_rl/reload_weights")
        async def reload_weights(raw: Request):
            body, err = await _body(raw, ("path", "reset_prefix_cache", "mode"))
            if err:
                return err
            client = raw.app.state.engine_client
            mode = body.get("mode", "wait")
            if mode not in RELOAD_MODES:
                return _error(400, f"reload_weights: mode {mode!r}: allowed {list(RELOAD_MODES)}")
            try:            # vLLM's reload kills the engine on a bad path: check it here
                _check_weights_dir(body.get("path"))
            except ValueError as e:
                return _error(400, f"reload_weights: {e}")
            from vllm_rl.weights import pause_parked

            t0 = time.perf_counter()
            await pause_parked(client, mode)     # arrivals wait for the resume, no 503
            try:
                await client.collective_rpc("reload_weights",
                                            kwargs={"weights_path": body.get("path")})
                if body.get("reset_prefix_cache", True):
                    await client.reset_prefix_cache()
            except Exception as e:        # a missing path, another architecture
                return _error(400, f"reload_weights: {e}")
            finally:
                await client.resume_generation()
            return {"reloaded": True, "path": body.get("path"), "mode": mode,
                    "seconds": round(time.perf_counter() - t0, 3)}

        app.include_router(router)

    async def init_state(self, engine_client, state, args) -> None:
        return None
