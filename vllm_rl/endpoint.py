"""HTTP routes of the RL engine's server: a ``vllm.endpoint_plugins`` entry point.

``POST /vllm_rl/arrol`` loads ARRoL head weights and/or a calibration into the running
server (the same as ``vllm_rl.LLM.arrol_update``); ``GET /vllm_rl/arrol`` returns the
head's version, shape, calibration and counts.  The engine side is the worker extension
(:mod:`vllm_rl.arrol.worker`, installed with the engine); this plugin only exposes it.

vLLM loads endpoint plugins only when ``VLLM_PLUGINS`` names them;
``python -m vllm_rl.serve`` adds ``vllm_rl`` to it.

    curl -X POST localhost:8000/vllm_rl/arrol -d '{"calibration": {...}}'
    {"version": 3}
"""

from typing import Any

# (no `from __future__ import annotations`: FastAPI reads the route annotations at runtime)
UPDATE_KEYS = ("head", "calibration", "cold_start", "version")


class RLEndpoints:
    """The plugin object vLLM instantiates (``EndpointPlugin`` protocol)."""

    name = "vllm_rl"
    required_tasks = None

    def attach_router(self, app) -> None:
        from fastapi import APIRouter, Request
        from fastapi.responses import JSONResponse

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

        app.include_router(router)

    async def init_state(self, engine_client, state, args) -> None:
        return None
