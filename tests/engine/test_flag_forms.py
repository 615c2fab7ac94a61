"""Every form of the flags through the real server, streamed and not: one table.

The forms of ``docs/flags.md`` (nested, JSON string, dotted, mixed) and what vLLM's
``vllm_xargs`` makes of them (a JSON ``true`` / ``false`` arrives as ``1`` / ``0``): a
good one is served (HTTP 200, a record per completion, the flags as sent: a
``hidden_id``, the worker keeping the vector, exactly when ``return_hidden`` was true),
a bad one is a true HTTP 400 before any stream whose message names the flag and its
allowed range, in both modes.  The
middleware (``vllm_rl/http_flags.py``) and the engine read the flags with one reader
(``vllm_rl.flags.read``), so no request passes one and fails the other.

ARRoL head updates (``POST /vllm_rl/arrol``) are checked in the front end against the
engine's head dims: a bad one is a 400 naming what is wrong, the head keeps serving,
and the server log gets no traceback.
"""
import json

import pytest

from server_fixture import call, shared_server, stream
from vllm_rl import RolloutInfo, rl_xargs
from vllm_rl.task import MODEL_PATH, heldout_prompts

pytestmark = pytest.mark.engine

_NESTED = {"group": {"size": 2}, "darts": {"mode": "shortest"}}
_HIDDEN = {"arrol": {"l_detect": 2, "return_hidden": True}}

FORMS = [  # (name, vllm_xargs as sent, n, expected: None = served | (flag, allowed range))
    ("nested", {"vllm_rl": _NESTED}, 2, None),
    ("nested_bad", {"vllm_rl": {"darts": {"mode": "longest"}}}, 2,
     ("darts.mode", "one of 'auto', 'dual_end', 'shortest'")),
    ("json", rl_xargs(**_HIDDEN), 1, None),
    ("json_bad", {"vllm_rl": json.dumps({"arrol": {"kappa": 2}})}, 1,
     ("arrol.kappa", "float in [0, 1]")),
    ("json_not_json", {"vllm_rl": "{oops"}, 1, ("vllm_rl", "a JSON object")),
    ("dotted", {"vllm_rl.arrol.l_detect": 2, "vllm_rl.duet.eps": 0.5}, 1, None),
    ("dotted_bad", {"vllm_rl.arrol.l_detect": 0}, 1, ("arrol.l_detect", "int in [1, ")),
    ("dotted_string_number", {"vllm_rl.duet.eps": "0.5"}, 1, ("duet.eps", "float in [1e-06, 1]")),
    ("mixed", rl_xargs(group={"size": 2}) | {"vllm_rl.darts.mode": "shortest"}, 2, None),
    ("mixed_bad", rl_xargs(group={"size": 2}, darts={}) | {"vllm_rl.darts.k": 9}, 2,
     ("darts.k", "int in [0, 2]")),
    ("bool_true", {"vllm_rl.arrol.l_detect": 2, "vllm_rl.arrol.return_hidden": True}, 1, None),
    ("bool_false", {"vllm_rl.arrol.l_detect": 2, "vllm_rl.arrol.return_hidden": False}, 1, None),
    ("bool_bad", {"vllm_rl.arrol.return_hidden": 2}, 1, ("arrol.return_hidden", "bool")),
    ("bool_string", {"vllm_rl.arrol.return_hidden": "true"}, 1, ("arrol.return_hidden", "bool")),
]


def _sent_hidden(xargs) -> bool | None:
    """What the request asked of return_hidden (None: no arrol flags)."""
    if "vllm_rl.arrol.return_hidden" in xargs:
        return bool(xargs["vllm_rl.arrol.return_hidden"])
    raw = xargs.get("vllm_rl")
    raw = json.loads(raw) if isinstance(raw, str) else raw
    if isinstance(raw, dict) and "arrol" in raw:
        return bool(raw["arrol"].get("return_hidden", False))
    return False if any(k.startswith("vllm_rl.arrol.") for k in xargs) else None


@pytest.fixture(scope="module")
def server():
    return shared_server()


@pytest.mark.parametrize("streamed", [False, True], ids=["not_streamed", "streamed"])
def test_every_form_gets_the_same_verdict_in_both_modes(server, streamed):
    prompt = heldout_prompts(1)[0]
    seen = []
    for name, xargs, n, expected in FORMS:
        body = {"model": str(MODEL_PATH), "prompt": prompt, "n": n, "max_tokens": 6,
                "temperature": 1.0, "seed": 3, "ignore_eos": True, "vllm_xargs": xargs}
        if streamed:
            status, resp, _ = stream(server, body)
        else:
            status, resp = call(server, "/v1/completions", body)
        seen.append((name, status))
        if expected is None:
            assert status == 200 and not resp.get("in_stream"), (name, status, resp)
            infos = [RolloutInfo.from_json(c["rollout_info"]) if c.get("rollout_info")
                     else None for c in resp["choices"]]
            assert len(infos) == n and all(infos), (name, resp)
            hidden = _sent_hidden(xargs)
            if hidden is not None:                    # scored at l_detect = 2 of 6 tokens
                assert all(i.score is not None for i in infos), (name, infos)
                assert all((i.hidden_id is not None) == hidden for i in infos), (name, infos)
            if "group" in json.dumps(xargs) or "vllm_rl.darts" in json.dumps(xargs):
                assert len({i.group_id for i in infos}) == 1 and infos[0].group_id, name
        else:
            flag, allowed = expected
            assert status == 400 and not resp.get("in_stream"), (name, status, resp)
            err = resp["error"]
            assert err["code"] == 400 and err["param"] == f"vllm_rl.{flag}", (name, err)
            assert f"'{flag}'" in err["message"] and f"allowed: {allowed}" in err["message"], \
                (name, err)
    assert len(seen) == len(FORMS)


def _log_text() -> str:
    import server_fixture

    return server_fixture._server["log"].read_text(errors="replace")


def test_a_bad_arrol_update_is_a_400_with_no_worker_traceback(server):
    """Checked in the front end against the engine's head (its hidden size, shapes,
    finite values, keys) and the calibration's fields: 400, head unchanged, no traceback
    in the server log (nothing reached a worker)."""
    from vllm_rl.arrol.head import QualityHead

    status, info = call(server, "/vllm_rl/arrol")
    assert status == 200, info
    hidden = info["hidden_size"]
    good = QualityHead(hidden, 4).export(7)
    bad = [
        ({"head": QualityHead(hidden + 1, 4).export(7)}, "hidden size"),
        ({"head": {**good, "w1": [[0.0] * hidden] * 3}}, "'w1'"),
        ({"head": {**good, "b2": "x"}}, "'b2'"),
        ({"head": {k: v for k, v in good.items() if k != "b1"}}, "missing keys ['b1']"),
        ({"head": "/no/such/head.json"}, "head file"),
        ({"calibration": {"pos": [0], "neg": [0]}}, "missing keys"),
        ({"version": -2}, "version"),
    ]
    before = len(_log_text())
    for body, says in bad:
        status, resp = call(server, "/vllm_rl/arrol", body)
        assert status == 400, (body.keys(), status, resp)
        assert "arrol_update" in resp["error"]["message"] and says in resp["error"]["message"], \
            resp
    after = call(server, "/vllm_rl/arrol")[1]
    assert after["version"] == info["version"], after        # the head kept serving
    added = _log_text()[before:]
    assert "Traceback" not in added, added[-3000:]
