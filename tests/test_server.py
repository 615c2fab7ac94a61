"""The ``vllm serve`` way in: flags through ``vllm_xargs``, records in the response, HTTP 400."""
import json
import sys
import threading
import time

import pytest

from conftest import MAX_MODEL_LEN
from server_fixture import call as _call, launch, stop
from vllm_rl import Reason, RolloutInfo, rl_xargs, server_args
from vllm_rl.llm import CPU_KV_CACHE_BYTES
from vllm_rl.task import MODEL_PATH

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    # vLLM's own `serve` subcommand, through vllm_rl.serve (the `vllm` script of the CPU
    # wheel cannot find its distribution metadata; see vllm_rl/serve.py).
    cmd = [sys.executable, "-m", "vllm_rl.serve", str(MODEL_PATH), "--seed", "0",
           "--max-model-len", str(MAX_MODEL_LEN),
           "--kv-cache-memory-bytes", str(CPU_KV_CACHE_BYTES), *server_args(arrol=True),
           "--arrol"]
    proc, base = launch(cmd, tmp_path_factory.mktemp("server") / "serve.log", "vllm serve")
    try:
        yield base
    finally:
        stop(proc)


def _post(base, body):
    return _call(base, "/v1/completions", body)


def _body(prompt, **kw):
    return {"model": str(MODEL_PATH), "prompt": prompt, "temperature": 1.0, "max_tokens": 256,
            "seed": 1, **kw}


def test_server_runs_a_darts_group_and_returns_records(server, prompts):
    status, resp = _post(server, _body(prompts[0], n=8, return_token_ids=True,
                                       vllm_xargs=rl_xargs(group={"size": 4},
                                                           darts={"mode": "shortest"})))
    assert status == 200, resp
    infos = [RolloutInfo.from_openai_choice(c) for c in resp["choices"]]
    assert len(infos) == 8 and len({i.group_id for i in infos}) == 1
    for c, info in zip(resp["choices"], infos):
        assert info.length == len(c["token_ids"])
        if info.reason is Reason.DARTS_CANCELLED:
            assert c["finish_reason"] == "abort" and info.weight == 0.0
    if any(i.reason is Reason.DARTS_CANCELLED for i in infos):
        assert sum(i.valid for i in infos) == 4


def test_server_dotted_flags_are_the_same_schema(server, prompts):
    xargs = {"vllm_rl.group.size": 4, "vllm_rl.darts.mode": "shortest"}
    status, resp = _post(server, _body(prompts[1], n=8, vllm_xargs=xargs))
    assert status == 200, resp
    assert all(RolloutInfo.decode(c["stop_reason"]) for c in resp["choices"])


def test_server_rejects_bad_flags_with_400_and_keeps_serving(server, prompts):
    result = {}
    slow = threading.Thread(target=lambda: result.update(
        ok=_post(server, _body(prompts[2], n=4, max_tokens=200, ignore_eos=True))))
    slow.start()
    time.sleep(0.2)
    for xargs, flag in [({"vllm_rl.darts.mode": "longest"}, "darts.mode"),
                        (rl_xargs(group={"size": 4}, darts={"k": 2}) | {"vllm_rl.darts.k": 9}, "darts.k"),
                        ({"vllm_rl": "{oops"}, "vllm_rl")]:
        status, resp = _post(server, _body(prompts[3], n=4, vllm_xargs=xargs))
        assert status == 400, resp
        assert f"'{flag}'" in json.dumps(resp) and "allowed" in json.dumps(resp)
    slow.join(timeout=120)
    status, resp = result["ok"]
    assert status == 200 and all(len(c["text"]) > 0 for c in resp["choices"])



def test_server_arrol_route_flags_and_records(server, prompts):
    """ARRoL over HTTP: calibration pushed through POST /vllm_rl/arrol, flags through
    vllm_xargs, scores, survival probabilities and hidden states in the records."""
    from vllm_rl.engine.policies.arrol import BINS

    status, info = _call(server, "/vllm_rl/arrol")
    assert status == 200 and info["calibrated"] is False
    cal = {"pos": [0] * BINS, "neg": [0] * BINS, "alpha": 1.0, "prior": 0.5, "delta": 0.0,
           "bins": BINS}
    status, resp = _call(server, "/vllm_rl/arrol", {"calibration": cal})
    assert status == 200, resp
    version = resp["version"]
    status, resp = _call(server, "/vllm_rl/arrol", {"calibration": {**cal, "alpha": -1}})
    assert status == 400 and "alpha" in json.dumps(resp)
    status, resp = _post(server, _body(prompts[5], n=8, max_tokens=64, vllm_xargs=rl_xargs(
        arrol={"l_detect": 16, "return_hidden": True})))
    assert status == 200, resp
    infos = [RolloutInfo.from_openai_choice(c) for c in resp["choices"]]
    scored = [i for i in infos if i.length > 16]
    assert scored and all(i.head_version == version and i.p == 0.5 for i in scored)
    assert all(i.hidden_state().shape == (info["hidden_size"],) for i in scored)
    assert all((i.reason is Reason.ARROL_PRUNED) == i.pruned for i in scored)
    status, resp = _post(server, _body(prompts[5], n=2, vllm_xargs={"vllm_rl.arrol.rho": 3}))
    assert status == 400 and "'arrol.rho'" in json.dumps(resp)
    assert _call(server, "/vllm_rl/arrol", {"cold_start": True})[0] == 200
