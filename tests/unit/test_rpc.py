"""The one RPC table and the one engine-settings object: every client is built from them."""
from __future__ import annotations

import asyncio
import inspect

import pytest

from vllm_rl.rpc import BY_NAME, METHODS, bind_sync


def test_call_args_check_like_a_python_call():
    m = BY_NAME["das_prebuild"]
    assert m.call_args("p", [[1, "2"]]) == ("p", [[1, 2]], None)
    assert m.call_args(problem_id=7, rollouts=[(3,)], prompt_token_ids=(4, 5)) == \
        ("7", [[3]], [4, 5])
    with pytest.raises(TypeError, match="missing rollouts"):
        m.call_args("p")
    with pytest.raises(TypeError, match="unexpected argument 'prompt'"):
        m.call_args("p", [], prompt="x")
    with pytest.raises(TypeError, match="twice"):
        m.call_args("p", [], problem_id="q")
    u = BY_NAME["arrol_update"]
    assert u.call_args() == (None, None, False, None)

    class Cal:
        def to_dict(self):
            return {"bins": 1}

    assert u.call_args(calibration=Cal(), cold_start=1)[1:3] == ({"bins": 1}, True)


def test_the_offline_engine_gets_every_method():
    calls = []

    @bind_sync
    class Engine:
        def collective_rpc(self, name, args=()):
            calls.append((name, args))
            return ["rank0", "rank1"]

    e = Engine()
    for m in METHODS:
        assert getattr(Engine, m.name).__doc__ == m.doc
    assert e.das_clear("p") == "rank0" and calls[-1] == ("das_clear", ("p",))
    assert e.arrol_update(version=3) == "rank0"
    assert calls[-1] == ("arrol_update", (None, None, False, 3))
    from vllm_rl.llm import LLM

    assert all(callable(getattr(LLM, m.name)) for m in METHODS)


def test_the_actor_mixin_and_the_worker_extension_follow_the_table():
    from vllm_rl.integrations.common.rpc import RLStateRPC
    from vllm_rl.worker import RLWorkerExtension

    class Actor(RLStateRPC):
        async def rl_rpc(self, method, args=()):
            return method, args

    for m in METHODS:
        assert inspect.iscoroutinefunction(getattr(RLStateRPC, m.name))
        assert callable(getattr(RLWorkerExtension, m.name)), m.name
    assert asyncio.run(Actor().das_prebuild("p", [[1]])) == ("das_prebuild", ("p", [[1]], None))
    assert asyncio.run(Actor().das_stats()) == ("das_stats", ())


def test_every_method_has_one_route():
    from fastapi import FastAPI

    from vllm_rl.endpoint import RLEndpoints

    app = FastAPI()
    RLEndpoints().attach_router(app)
    routes = {(r.path, tuple(sorted(r.methods))) for r in app.routes if hasattr(r, "methods")}
    for m in METHODS:
        assert (m.http[1], (m.http[0],)) in routes, m.name
    assert ("/vllm_rl/reload_weights", ("POST",)) in routes


def test_engine_settings_give_the_same_engine_as_keywords_and_as_cli_flags():
    """The settings' keyword arguments and their `vllm serve` flags parse to the same
    engine arguments (vLLM's own parser)."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from vllm_rl.settings import EngineSettings

    settings = EngineSettings.of(das={"budget": 2}, arrol=True, cost="h100", trace=True)
    kwargs = settings.engine_kwargs({"model": "m"})
    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    parsed = EngineArgs.from_cli_args(parser.parse_args(["--model", "m"]
                                                        + settings.cli_args()))
    for key in ("scheduler_cls", "async_scheduling", "worker_extension_cls",
                "additional_config"):
        assert getattr(parsed, key) == kwargs[key], key
    assert parsed.speculative_config == kwargs["speculative_config"]
    assert settings.env() == {"VLLM_USE_V2_MODEL_RUNNER": "0"}
    with pytest.raises(ValueError, match="das= sets async_scheduling"):
        settings.engine_kwargs({"async_scheduling": True})
    with pytest.raises(ValueError):
        EngineSettings.of(cost="no-such-table:x")
