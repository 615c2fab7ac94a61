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
