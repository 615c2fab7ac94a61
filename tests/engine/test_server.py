"""The ``vllm serve`` way in: flags through ``vllm_xargs``, records in the response, HTTP 400.

A bad flag is a real HTTP 400 on ``/v1/completions`` and ``/v1/chat/completions``,
streamed or not: ``vllm_rl.http_flags`` checks the flags before vLLM starts the
response (``vllm_rl/endpoint.py`` installs it), so no 200 headers and no in-stream
error event.
"""
import http.client
import json

import pytest

from server_fixture import Flight, call as _call, shared_server
from vllm_rl import Reason, RolloutInfo, rl_xargs
from vllm_rl.task import MODEL_PATH

pytestmark = pytest.mark.engine
ROUTES = ("/v1/completions", "/v1/chat/completions")


@pytest.fixture(scope="module")
def server():
    """The shared ``vllm-rl serve`` (``server_fixture.shared_server``: the RL engine with
    DAS and ARRoL, a plain chat template for /v1/chat/completions)."""
    return shared_server()


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
    assert all(c.get("rollout_info") for c in resp["choices"])


def test_server_rejects_bad_flags_with_400_and_keeps_serving(server, prompts):
    # a request in flight (it has streamed output, with most of its ignore_eos tokens to
    # go) while bad flags are refused: it runs on, whole
    slow = Flight(server, _body(prompts[2], n=4, max_tokens=200, ignore_eos=True,
                                return_token_ids=True))
    slow.wait_started()
    for xargs, flag in [({"vllm_rl.darts.mode": "longest"}, "darts.mode"),
                        (rl_xargs(group={"size": 4}, darts={"k": 2}) | {"vllm_rl.darts.k": 9}, "darts.k"),
                        ({"vllm_rl": "{oops"}, "vllm_rl")]:
        status, resp = _post(server, _body(prompts[3], n=4, vllm_xargs=xargs))
        assert status == 400, resp
        assert f"'{flag}'" in json.dumps(resp) and "allowed" in json.dumps(resp)
        for route in ROUTES:        # streamed: the same 400, not a stream with an error
            status, _, text = _open(server, route, _request(route, prompts[3], n=4,
                                                            stream=True, vllm_xargs=xargs))
            assert status == 400 and f"'{flag}'" in text, text
    status, resp, _ = slow.result()
    assert status == 200 and len(resp["choices"]) == 4, resp
    for c in resp["choices"]:
        assert c["finish_reason"] == "length" and len(c["token_ids"]) == 200 and c["text"], c


def test_server_arrol_route_flags_and_records(server, prompts):
    """ARRoL over HTTP: calibration pushed through POST /vllm_rl/arrol, flags through
    vllm_xargs, scores and survival probabilities in the records, the hidden states they
    name taken through POST /vllm_rl/arrol/hidden (base64 float32, once)."""
    from vllm_rl.arrol.rule import BINS

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
    from vllm_rl.outcome import hidden_ids, with_hidden

    ids = hidden_ids(scored)
    assert len(ids) == len(scored) and all("hidden" not in c["rollout_info"]
                                           for c in resp["choices"])
    status, kept = _call(server, "/vllm_rl/arrol/hidden", {"request_ids": ids})
    assert status == 200 and set(kept["hidden"]) == set(ids), kept
    scored = with_hidden(scored, kept["hidden"])
    assert all(i.hidden_state().shape == (info["hidden_size"],) for i in scored)
    assert _call(server, "/vllm_rl/arrol/hidden", {"request_ids": ids}) == (200, {"hidden": {}})
    assert _call(server, "/vllm_rl/arrol/hidden", {"request_ids": ids[0]})[0] == 400
    assert all((i.reason is Reason.ARROL_PRUNED) == i.pruned for i in scored)
    status, resp = _post(server, _body(prompts[5], n=2, vllm_xargs={"vllm_rl.arrol.rho": 3}))
    assert status == 400 and "'arrol.rho'" in json.dumps(resp)
    assert _call(server, "/vllm_rl/arrol", {"cold_start": True})[0] == 200


# ------------------------------------------------------- a real 400 before any stream
def _request(route, prompt, **kw):
    """A completions or chat-completions body for ``prompt``."""
    where = {"messages": [{"role": "user", "content": prompt}]} if "chat" in route \
        else {"prompt": prompt}
    return {"model": str(MODEL_PATH), **where, "temperature": 1.0, "seed": 1, **kw}


def _open(base, route, body):
    """POST ``body``: (status, Content-Type, the whole response text).  The status and
    headers are the first bytes the server sends: a 400 here was never a 200 stream."""
    host, port = base.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    try:
        conn.request("POST", route, json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.getheader("Content-Type", ""), resp.read().decode()
    finally:
        conn.close()


def _events(text):
    """The ``data:`` payloads of a server-sent event stream, ``[DONE]`` included."""
    return [line[5:].strip() for line in text.splitlines() if line.startswith("data:")]


BAD = [  # (vllm_xargs, n, the flag the 400 names)
    ({"vllm_rl": json.dumps({"group": {"size": 2}, "darts": {"mode": "longest"}})}, 2,
     "darts.mode"),                                         # the JSON-string form
    ({"vllm_rl.duet.eps": 1.5}, 1, "duet.eps"),             # the dotted form
    ({"vllm_rl.group.redundant": 3}, 2, "group.redundant"),  # checked against n
    (rl_xargs(group={"size": 2}, darts={"k": 1}) | {"vllm_rl.darts.k": 9}, 2, "darts.k"),
    ({"vllm_rl": "{oops"}, 1, "vllm_rl"),                   # not JSON
    ({"vllm_rl.das.budget": 5}, 1, "das.budget"),           # above this server's drafter's b (4)
    ({"vllm_rl.partial.step": 1.5}, 1, "partial.step"),     # partial rollouts' flags
    ({"vllm_rl": json.dumps({"partial": {"step": 1, "start_step": 0, "prior_tokens": 5,
                                         "prior_versions": [[0, 0], [1, 5]]}})}, 1,
     "partial.prior_versions"),                             # a span holding no token
    ({"vllm_rl.partial.step": 1, "vllm_rl.partial.prior_tokens": 4}, 1,
     "partial.start_step"),                                 # a continuation needs it
    ({"vllm_rl.partial.until_groups": 0}, 1, "partial.until_groups"),
]


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("streamed", [True, False], ids=["streamed", "not_streamed"])
def test_server_bad_flag_is_http_400_before_the_response(server, prompts, route, streamed):
    for xargs, n, flag in BAD:
        body = _request(route, prompts[6], n=n, max_tokens=8, stream=streamed,
                        vllm_xargs=xargs)
        status, ctype, text = _open(server, route, body)
        assert status == 400 and ctype.startswith("application/json"), (flag, status, text)
        err = json.loads(text)["error"]              # vLLM's ErrorResponse, not an SSE event
        assert err["code"] == 400 and err["type"] == "BadRequestError", err
        assert f"'{flag}'" in err["message"] and "allowed" in err["message"], err
        assert err["param"] == f"vllm_rl.{flag}", err


@pytest.mark.parametrize("route", ROUTES)
def test_server_good_flags_still_stream(server, prompts, route):
    """Valid flags, both forms: 200, an event stream with a chunk per token and
    ``[DONE]``, both samples finished, each with its record (completions)."""
    for xargs in (rl_xargs(group={"size": 2}, darts={"mode": "shortest"}),
                  {"vllm_rl.group.size": 2, "vllm_rl.darts.mode": "shortest"}):
        body = _request(route, prompts[7], n=2, max_tokens=16, stream=True, vllm_xargs=xargs)
        status, ctype, text = _open(server, route, body)
        assert status == 200 and ctype.startswith("text/event-stream"), (status, text)
        events = _events(text)
        assert events[-1] == "[DONE]" and len(events) > 2, events
        chunks = [json.loads(e) for e in events[:-1]]
        assert not any("error" in c for c in chunks), chunks
        ends = {c["index"]: c for ch in chunks for c in ch["choices"] if c.get("finish_reason")}
        assert sorted(ends) == [0, 1], chunks
        infos = [RolloutInfo.from_json(c["rollout_info"]) for c in ends.values()]
        assert len({i.group_id for i in infos}) == 1, infos
        assert all(c["stop_reason"] is None or not str(c["stop_reason"]).startswith("vllm_rl")
                   for c in ends.values()), ends


def test_server_openai_client_gets_bad_request_error(server, prompts):
    """The OpenAI client, flags in ``extra_body={"vllm_xargs": ...}``: a bad flag raises
    ``BadRequestError`` (status 400) from ``create`` itself, streamed too; a good
    streamed chat completion still yields its chunks."""
    import openai

    client = openai.OpenAI(base_url=server + "/v1", api_key="none", max_retries=0)
    bad = {"vllm_xargs": {"vllm_rl.arrol.rho": 3}}
    calls = [lambda s: client.completions.create(model=str(MODEL_PATH), prompt=prompts[8],
                                                 max_tokens=8, stream=s, extra_body=bad),
             lambda s: client.chat.completions.create(
                 model=str(MODEL_PATH), max_tokens=8, stream=s, extra_body=bad,
                 messages=[{"role": "user", "content": prompts[8]}])]
    for create in calls:
        for streamed in (True, False):
            with pytest.raises(openai.BadRequestError) as e:
                create(streamed)
            assert e.value.status_code == 400 and "'arrol.rho'" in str(e.value)
    chunks = list(client.chat.completions.create(
        model=str(MODEL_PATH), max_tokens=8, stream=True, seed=1,
        messages=[{"role": "user", "content": prompts[8]}],
        extra_body={"vllm_xargs": rl_xargs(duet=True)}))
    assert chunks and chunks[-1].choices[0].finish_reason is not None


def test_server_ends_a_step_over_http(server, prompts):
    """``POST /vllm_rl/end_step``: a trainer that drives the server over HTTP ends its
    step; the sample in flight comes back ``carried`` with every token so far, and once
    nothing runs ``/metrics`` says so (the step's stats taken after the early end: no KV
    in use, nothing running).  A step that is not an int >= 0 is a 400 naming
    ``partial.step``; a step the engine does not hold answers 0 live."""
    from server_fixture import metrics, wait_until
    from vllm_rl.metrics import total

    for bad in (1.5, True, "3", -1, None):
        status, resp = _call(server, "/vllm_rl/end_step", {"step": bad})
        assert status == 400 and "'partial.step'" in resp["error"]["message"], (bad, resp)
    assert _call(server, "/vllm_rl/end_step", {})[0] == 400
    assert _call(server, "/vllm_rl/end_step", {"step": 90_001}) == (
        200, {"step": 90_001, "live": 0})
    flight = Flight(server, _body(prompts[9], max_tokens=400, ignore_eos=True,
                                  return_token_ids=True,
                                  vllm_xargs=rl_xargs(partial={"step": 90_002})))
    flight.wait_started()
    assert _call(server, "/vllm_rl/end_step", {"step": 90_002}) == (
        200, {"step": 90_002, "live": 1})
    status, resp, _ = flight.result()
    assert status == 200, resp
    (choice,) = resp["choices"]
    info = RolloutInfo.from_json(choice["rollout_info"])
    assert info.reason is Reason.CARRIED and info.step == 90_002
    assert 0 < info.length == len(choice["token_ids"]) < 400

    def freed():
        m = metrics(server)
        return (total(m, "vllm:num_requests_running") == 0
                and total(m, "vllm:kv_cache_usage_perc") == 0.0)

    wait_until(freed, "the carried sample's KV shown free on /metrics")
