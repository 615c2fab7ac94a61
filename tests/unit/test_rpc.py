"""The one RPC table and the one engine-settings object: every client follows them."""
from __future__ import annotations

import asyncio
import importlib
import inspect
from types import SimpleNamespace

import numpy as np
import pytest

from vllm_rl.rpc import BY_NAME, METHODS

REQUIRED = "<required>"


def _offline(collective_rpc, vllm_config=None):
    """A ``vllm_rl.LLM`` with no engine: its RPC methods on ``collective_rpc``."""
    from vllm_rl.llm import LLM

    llm = LLM.__new__(LLM)
    llm.collective_rpc = collective_rpc
    llm.llm_engine = SimpleNamespace(vllm_config=vllm_config)
    return llm


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

    def rpc(name, args=()):
        calls.append(name)
        return [1]

    llm = _offline(rpc, _Engine())        # vllm_rl.LLM: checked against its engine, no RPC sent
    with pytest.raises(ValueError, match="hidden size 4"):
        llm.arrol_update(head=wrong)
    assert calls == [] and llm.arrol_update(head=good) == 1


def test_the_actors_check_an_update_before_any_worker():
    """verl's and OpenRLHF's actors (RLStateRPC): a bad head or calibration is a
    ValueError on the actor, engine-free before the engine runs and against the engine's
    hidden size once it does; rl_rpc (collective_rpc) is never reached."""
    from vllm_rl.arrol.head import QualityHead
    from vllm_rl.integrations.common.rpc import RLStateRPC

    sent = []

    class Actor(RLStateRPC):
        config = None

        async def rl_rpc(self, method, args=()):
            sent.append(method)
            return 5

        def rl_vllm_config(self):
            return self.config

    actor = Actor()
    with pytest.raises(ValueError, match="alpha"):
        asyncio.run(actor.arrol_update(calibration={"pos": [1], "neg": [1], "alpha": -1.0,
                                                    "prior": 0.5, "delta": 0.0, "bins": 1}))
    wrong = QualityHead(5, 3).export(1)
    assert asyncio.run(actor.arrol_update(head=wrong)) == 5      # no engine yet: dims unknown
    actor.config = _Engine()
    with pytest.raises(ValueError, match="hidden size 4"):
        asyncio.run(actor.arrol_update(head=wrong))
    with pytest.raises(ValueError, match="request_ids"):
        asyncio.run(actor.arrol_hidden("one-id"))                 # not read as characters
    assert sent == ["arrol_update"]


def test_the_offline_engine_gets_every_method():
    calls = []

    def rpc(name, args=()):
        calls.append((name, args))
        if name == "arrol_hidden":
            return [{"a": np.ones(2, "<f4").tobytes()}, {}]
        return ["rank0", "rank1"]

    e = _offline(rpc)
    assert e.das_clear("p") == "rank0" and calls[-1] == ("das_clear", ("p",))
    assert e.arrol_update(version=3) == "rank0"
    assert calls[-1] == ("arrol_update", (None, None, False, 3))
    got = e.arrol_hidden(("a", "b"))
    assert calls[-1] == ("arrol_hidden", (["a", "b"],)) and set(got) == {"a"}
    assert got["a"].tolist() == [1.0, 1.0]
    assert e.das_prebuild("p", [["1"]]) == "rank0"
    assert calls[-1] == ("das_prebuild", ("p", [[1]], None))


def _signature(fn) -> list[tuple[str, object]]:
    """(name, default or REQUIRED) of a method's parameters after ``self`` (Ray, once an
    actor class derives from the class, adds a keyword-only ``_ray_trace_ctx``)."""
    params = [p for p in list(inspect.signature(fn).parameters.values())[1:]
              if p.name != "_ray_trace_ctx"]
    assert all(p.kind is p.POSITIONAL_OR_KEYWORD for p in params), fn.__qualname__
    return [(p.name, REQUIRED if p.default is p.empty else p.default) for p in params]


def _rpc_names(cls) -> set[str]:
    return {n for n in dir(cls) if n.startswith(("das_", "arrol_")) and callable(getattr(cls, n))}


def _surfaces():
    from vllm_rl.integrations.common.rpc import RLStateRPC
    from vllm_rl.llm import LLM
    from vllm_rl.worker import RLWorkerExtension

    return {"vllm_rl.LLM": LLM, "RLStateRPC": RLStateRPC, "RLWorkerExtension": RLWorkerExtension}


@pytest.mark.parametrize("surface", ["vllm_rl.LLM", "RLStateRPC", "RLWorkerExtension"])
def test_every_surface_has_the_tables_methods(surface):
    """Every way to call the RL state has exactly the table's das_* / arrol_* methods:
    the worker's signature (same parameters in the same order, same defaults) and, on
    the front ends, generated from the table with its docstring (nothing to drift)."""
    cls = _surfaces()[surface]
    assert _rpc_names(cls) == set(BY_NAME), surface
    for m in METHODS:
        fn = getattr(cls, m.name)
        expected = [(p, m.defaults.get(p, REQUIRED)) for p in m.params]
        assert _signature(fn) == expected, (surface, m.name)
        assert (fn.__doc__ or "").strip(), (surface, m.name)
        if surface != "RLWorkerExtension":
            assert fn.__doc__ == m.doc and fn.__qualname__.endswith(m.name), (surface, m.name)
        assert inspect.iscoroutinefunction(fn) == (surface == "RLStateRPC"), (surface, m.name)


def test_each_method_is_defined_by_its_owner_and_reaches_the_worker_extension():
    """The table's ``owner`` defines the method (the worker side, where collective_rpc
    lands) with the table's parameters, and the worker extension is a plain subclass of
    every owner (its one override, ``arrol_hidden``, only puts the vectors in a form
    that crosses the engine core: bytes)."""
    from vllm_rl.worker import RLWorkerExtension

    for m in METHODS:
        module, _, name = m.owner.rpartition(".")
        owner = getattr(importlib.import_module(module), name)
        assert m.name in vars(owner), m.name
        assert _signature(vars(owner)[m.name]) == [(p, m.defaults.get(p, REQUIRED))
                                                   for p in m.params], m.name
        assert issubclass(RLWorkerExtension, owner)
        if m.name != "arrol_hidden":
            assert getattr(RLWorkerExtension, m.name) is vars(owner)[m.name]


def test_hidden_states_cross_the_engine_core_as_bytes(monkeypatch):
    """vLLM's engine core returns a utility result to its client through msgpack, which
    turns a numpy array into a raw [dtype, shape, buffer index]; the worker extension
    sends bytes and every client reads float32 vectors back, exactly."""
    from vllm.v1.engine import EngineCoreOutputs, UtilityOutput
    from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder, UtilityResult

    from vllm_rl.arrol.worker import ArrolWorkerExtension
    from vllm_rl.worker import RLWorkerExtension

    vec = (np.arange(4096, dtype=np.float32) - 7.5) / 3
    kept = {"0_r": vec, "1_r": vec[:4] * 2}
    worker = RLWorkerExtension.__new__(RLWorkerExtension)
    scorer = SimpleNamespace(take_hidden=lambda ids: {i: kept[i] for i in ids if i in kept})
    monkeypatch.setattr(ArrolWorkerExtension, "_arrol", lambda self: scorer)
    wire = worker.arrol_hidden(["0_r", "1_r", "gone"])
    out = EngineCoreOutputs(utility_output=UtilityOutput(call_id=1, result=UtilityResult(wire)))
    back = MsgpackDecoder(EngineCoreOutputs).decode(MsgpackEncoder().encode(out))
    got = BY_NAME["arrol_hidden"].result([back.utility_output.result.result])
    assert set(got) == {"0_r", "1_r"}
    np.testing.assert_array_equal(got["0_r"], vec)
    np.testing.assert_array_equal(got["1_r"], vec[:4] * 2)
    assert got["0_r"].dtype == np.float32
    assert BY_NAME["arrol_hidden"].read({"x": vec})["x"].dtype == np.float32   # in-process


def test_the_actor_mixin_calls_through_rl_rpc():
    from vllm_rl.integrations.common.rpc import RLStateRPC

    calls = []

    class Actor(RLStateRPC):
        async def rl_rpc(self, method, args=()):
            calls.append((method, args))
            if method == "arrol_hidden":
                return {rid: np.full(3, 0.5, "<f4").tobytes() for rid in args[0]}
            return method, args

    assert asyncio.run(Actor().das_prebuild("p", [[1]])) == ("das_prebuild", ("p", [[1]], None))
    assert asyncio.run(Actor().das_stats()) == ("das_stats", ())
    got = asyncio.run(Actor().arrol_hidden(["r-1"]))
    assert calls[-1] == ("arrol_hidden", (["r-1"],)) and got["r-1"].tolist() == [0.5] * 3


def test_every_method_has_one_route():
    from fastapi import FastAPI

    from vllm_rl.endpoint import RLEndpoints

    app = FastAPI()
    RLEndpoints().attach_router(app)
    routes = {(r.path, tuple(sorted(r.methods))) for r in app.routes if hasattr(r, "methods")}
    for m in METHODS:
        assert (m.http[1], (m.http[0],)) in routes, m.name
    assert ("/vllm_rl/reload_weights", ("POST",)) in routes


def test_the_hidden_route_answers_base64_float32_per_id():
    """POST /vllm_rl/arrol/hidden: the ids checked, one collective_rpc, each vector as
    base64 of float32 little-endian (decode_hidden reads it back exactly)."""
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from vllm_rl.endpoint import RLEndpoints
    from vllm_rl.outcome import decode_hidden

    vec = np.array([0.5, -1.25, 3.0e-8, 7.0], dtype=np.float32)
    calls = []

    class Client:
        async def collective_rpc(self, name, args=()):
            calls.append((name, args))
            return [{"r-1": vec.tobytes()}, {"r-1": vec.tobytes()}]

    app = FastAPI()
    RLEndpoints().attach_router(app)
    app.state.engine_client = Client()
    http = TestClient(app)
    resp = http.post("/vllm_rl/arrol/hidden", json={"request_ids": ["r-1", "r-2"]})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert set(body) == {"hidden"} and set(body["hidden"]) == {"r-1"}
    np.testing.assert_array_equal(decode_hidden(body["hidden"]["r-1"]), vec)
    assert calls == [("arrol_hidden", (["r-1", "r-2"],))]
    for bad in ({"request_ids": "r-1"}, {"ids": ["r-1"]}, {}):
        assert http.post("/vllm_rl/arrol/hidden", json=bad).status_code == 400, bad
    assert len(calls) == 1


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
    assert settings.env() == {"VLLM_USE_V2_MODEL_RUNNER": "0", "VLLM_RL_ENGINE": "1"}
    sync = EngineSettings.of(das={"budget": 2, "async_scheduling": False})
    with pytest.raises(ValueError, match="async_scheduling"):
        sync.engine_kwargs({"async_scheduling": True})
    own = settings.engine_kwargs({"async_scheduling": False})        # the caller's choice
    assert own["scheduler_cls"].endswith("RLSyncScheduler")
    with pytest.raises(ValueError):
        EngineSettings.of(cost="no-such-table:x")
