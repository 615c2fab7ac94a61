"""The serving-layer flag check (``vllm_rl/http_flags.py``) without a server: which
bodies it rejects, which it leaves to vLLM, and the 400 it answers.  The live-server
behaviour (a real 400 before any stream, both routes, the DAS check against the
server's real engine config) is in ``tests/engine/test_server.py``."""
import json

import pytest

from vllm_rl import rl_xargs
from vllm_rl.flags import FlagError
from vllm_rl.http_flags import check_body, error_response


@pytest.mark.parametrize("body, flag", [
    ({"vllm_xargs": {"vllm_rl.darts.mode": "longest"}}, "darts.mode"),
    ({"n": 4, "vllm_xargs": {"vllm_rl.group.redundant": 5}}, "group.redundant"),
    ({"n": 4.0, "vllm_xargs": {"vllm_rl.group.redundant": 5}}, "group.redundant"),
    ({"vllm_xargs": {"vllm_rl": "{oops"}}, "vllm_rl"),
    ({"vllm_xargs": {"vllm_rl": 3}}, "vllm_rl"),
    ({"vllm_xargs": {"vllm_rl.darts": 1}}, "darts"),
])
def test_bad_flags_raise_naming_the_flag(body, flag):
    with pytest.raises(FlagError) as e:
        check_body(body)
    assert e.value.flag == flag and "allowed" in str(e.value)


@pytest.mark.parametrize("body", [
    {"n": 4, "vllm_xargs": rl_xargs(group={"size": 2}, darts={"mode": "shortest"})},
    {"vllm_xargs": {"vllm_rl.duet.eps": 0.1, "session_id": "s"}},
    {"vllm_xargs": {"session_id": "s"}},          # no RL flags
    {"n": None, "vllm_xargs": {"vllm_rl.darts.mode": "shortest"}},
    [1, 2], {"vllm_xargs": "not a mapping"},      # vLLM's own validation answers these
    {"n": "x", "vllm_xargs": {"vllm_rl.darts.mode": "longest"}},
])
def test_good_or_not_ours_pass(body):
    check_body(body)


def test_error_response_is_vllms_400():
    body = json.dumps({"stream": True, "vllm_xargs": {"vllm_rl.duet.eps": 2}}).encode()
    response = error_response(body)
    assert response.status_code == 400
    err = json.loads(response.body)["error"]
    assert err["code"] == 400 and err["type"] == "BadRequestError"
    assert err["param"] == "vllm_rl.duet.eps" and "'duet.eps'" in err["message"]
    assert error_response(b'{"prompt": "x"}') is None          # no flags: not parsed
    assert error_response(b'{"vllm_rl": oops') is None         # not JSON: vLLM answers


# ------------------------------------------- the middleware and the engine agree
_GOOD = {"group": {"size": 2}, "arrol": {"l_detect": 24, "return_hidden": True}}
FORMS = [  # (vllm_xargs as sent in the JSON body, n, the flag a 400 names; None: good)
    ({"vllm_rl": _GOOD}, 2, None),                                         # nested
    ({"vllm_rl": {"arrol": {"l_detect": 0}}}, 1, "arrol.l_detect"),
    (rl_xargs(**_GOOD), 2, None),                                          # JSON string
    ({"vllm_rl": json.dumps({"arrol": {"kappa": 2}})}, 1, "arrol.kappa"),
    ({"vllm_rl.arrol.l_detect": 24}, 1, None),                             # dotted
    ({"vllm_rl.arrol.l_detect": -3}, 1, "arrol.l_detect"),
    ({"vllm_rl.arrol.return_hidden": True}, 1, None),         # JSON true: vLLM sends 1
    ({"vllm_rl.arrol.return_hidden": False}, 1, None),        # JSON false: 0
    ({"vllm_rl.arrol.return_hidden": 2}, 1, "arrol.return_hidden"),
    ({"vllm_rl.arrol.return_hidden": "yes"}, 1, "arrol.return_hidden"),
    ({"vllm_rl.arrol.l_detect": True}, 1, None),              # true is the int 1 there
    ({"vllm_rl.arrol.l_detect": "24"}, 1, "arrol.l_detect"),  # a string stays a string
    ({"vllm_rl.group.redundant": 3}, 2, "group.redundant"),   # against n
    ({"vllm_rl": "{oops"}, 1, "vllm_rl"),
]


def _verdict(fn):
    try:
        fn()
    except FlagError as e:
        return e.flag
    return None


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize("xargs, n, flag", FORMS)
def test_the_middleware_and_the_engine_give_the_same_verdict(route, xargs, n, flag):
    """The middleware's verdict on the JSON body equals the engine's reader on what vLLM
    itself delivers for it (its request model, ``to_sampling_params``), form by form."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    from vllm_rl.flags import read
    from vllm_rl.http_flags import carry_nested

    chat = "chat" in route
    body = {"model": "m", "n": n, "vllm_xargs": xargs,
            **({"messages": [{"role": "user", "content": "x"}]} if chat else {"prompt": "x"})}
    body = json.loads(json.dumps(body))                  # as the server parses it
    front = _verdict(lambda: check_body(body, route=route))
    handed = carry_nested(body) or body                  # the nested form: its JSON string
    model = ChatCompletionRequest if chat else CompletionRequest
    params = model.model_validate(handed).to_sampling_params(16, {})
    engine = _verdict(lambda: read(params.extra_args, n=params.n, default_group_id="g"))
    assert front == engine == flag, (front, engine, flag)


def test_the_nested_form_is_carried_as_its_json_string():
    from vllm_rl.http_flags import carry_nested, screen

    body = {"prompt": "x", "n": 2, "vllm_xargs": {"vllm_rl": _GOOD, "session_id": "s"}}
    carried = carry_nested(body)
    assert carried["vllm_xargs"] == {"vllm_rl": rl_xargs(**_GOOD)["vllm_rl"], "session_id": "s"}
    assert body["vllm_xargs"]["vllm_rl"] == _GOOD                   # the original untouched
    response, new_body = screen(json.dumps(body).encode())
    assert response is None and json.loads(new_body) == carried
    assert screen(json.dumps({"n": 2, "vllm_xargs": rl_xargs(**_GOOD)}).encode()) == (None, None)
