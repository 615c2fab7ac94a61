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

    from vllm_rl.arrol.rule import Calibration

    cal = {"pos": [1], "neg": [2], "alpha": 1.0, "prior": 0.5, "delta": 0.0, "bins": 1}
    assert u.call_args(calibration=Calibration.from_dict(cal), cold_start=0)[1:3] == \
        (cal, False)
    assert u.call_args(cold_start=1)[2] is True


class _Model:
    def get_hidden_size(self):
        return 4


class _Engine:
    """A vllm_config with an ARRoL head on a model of hidden size 4."""
    additional_config = {"vllm_rl_arrol": {}}
    model_config = _Model()


@pytest.mark.parametrize("kwargs, says", [
    ({"calibration": {"bins": 1}}, "missing keys"),
    ({"calibration": {"pos": [1], "neg": [1], "alpha": -1.0, "prior": 0.5, "delta": 0.0,
                      "bins": 1}}, "alpha"),
    ({"cold_start": True, "calibration": {"pos": [1], "neg": [1], "alpha": 1.0,
                                          "prior": 0.5, "delta": 0.0, "bins": 1}},
     "together"),
    ({"cold_start": "yes"}, "cold_start"),
    ({"version": -1}, "version"),
    ({"version": "3"}, "version"),
    ({"head": {"w1": []}}, "missing keys"),
    ({"head": "/no/such/head.json"}, "head file"),
])
def test_a_bad_arrol_update_fails_before_any_worker(kwargs, says):
    """The table checks an update whole on every path (LLM, actors, HTTP route): a
    ValueError naming what is wrong, and collective_rpc never called."""
    with pytest.raises(ValueError, match=says):
        BY_NAME["arrol_update"].call_args(**kwargs)


def test_arrol_update_is_checked_against_the_engine():
    import torch

    from vllm_rl.arrol.head import QualityHead

    u = BY_NAME["arrol_update"]
    good = QualityHead(4, 3).export(1)
    assert u.engine_call_args(_Engine(), head=good)[0] == good
    wrong = QualityHead(5, 3).export(1)                  # another model's hidden size
    with pytest.raises(ValueError, match="hidden size 4"):
        u.engine_call_args(_Engine(), head=wrong)
    bad = {**good, "w1": torch.zeros(3, 5).tolist()}     # a shape the dims do not give
    with pytest.raises(ValueError, match="'w1'"):
        u.engine_call_args(_Engine(), head=bad)
    nan = {**good, "b2": float("nan")}
    with pytest.raises(ValueError, match="finite"):
        u.engine_call_args(_Engine(), head=nan)

    class NoHead:
        additional_config = {}

    with pytest.raises(ValueError, match="without an ARRoL quality head"):
        u.engine_call_args(NoHead(), cold_start=True)
    calls = []

    @bind_sync
    class Engine:                 # vllm_rl.LLM: checked against its engine, no RPC sent
        class llm_engine:
            vllm_config = _Engine()

        def collective_rpc(self, name, args=()):
            calls.append(name)
            return [1]

    with pytest.raises(ValueError, match="hidden size 4"):
        Engine().arrol_update(head=wrong)
    assert calls == [] and Engine().arrol_update(head=good) == 1


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
