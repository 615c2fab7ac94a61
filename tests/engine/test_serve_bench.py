"""``vllm-rl serve`` on loopback (the shared server): an OpenAI client with flags,
``vllm-rl serve-bench`` against it (JSON fields, records, PNGs), the DAS and weight-reload
routes."""
import json
import shutil
from pathlib import Path

import pytest

from conftest import MAX_MODEL_LEN
from server_fixture import Background, Flight, call as _call, shared_server, wait_until
from vllm_rl import Reason, RolloutInfo, rl_xargs
from vllm_rl.task import MODEL_PATH

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def server():
    """The shared ``vllm-rl serve`` (DAS and ARRoL, vLLM's development routes:
    ``server_fixture.shared_server``); the reload tests end on its served checkpoint."""
    return shared_server()


def test_openai_client_with_flags(server, prompts):
    from openai import OpenAI

    client = OpenAI(base_url=server + "/v1", api_key="none")
    model = client.models.list().data[0].id
    resp = client.completions.create(
        model=model, prompt=prompts[0], n=4, max_tokens=64, temperature=1.0, seed=3,
        extra_body={"vllm_xargs": rl_xargs(group={"size": 2}, darts={"mode": "shortest"}),
                    "return_token_ids": True})
    infos = [RolloutInfo.from_openai_choice(c.model_dump()) for c in resp.choices]
    assert len(infos) == 4 and len({i.group_id for i in infos}) == 1
    assert all(i.group_id is not None for i in infos)


def test_serve_bench_n_requests_sweep(server, tmp_path):
    from vllm_rl.bench import serve as serve_bench

    result = serve_bench.main(["--base-url", server, "--labels", "rl", "--prompts", "2",
                               "--samples", "4", "--max-tokens", "48",
                               "--techniques", "darts,duet,das,arrol",
                               "--concurrency", "1,inf", "--out", str(tmp_path)])
    assert [r["max_concurrency"] for r in result["runs"]] == [1, None]
    for run in result["runs"]:
        assert run["failed"] == 0 and run["num_requests"] == 2 and run["num_samples"] == 8
        for key in ("request_throughput", "output_throughput", "mean_ttft_ms", "p99_ttft_ms",
                    "mean_tpot_ms", "median_itl_ms", "p99_e2el_ms", "makespan_s",
                    "p90_group_completion_s", "total_output_tokens"):
            assert run[key] >= 0, key
        assert sum(run["samples_by_reason"].values()) == 8
        assert run["selected_samples"] <= run["kept_samples"] <= 8
        assert set(run["samples_by_reason"]) <= {r.value for r in Reason}
        assert run["records"] == 8                 # every sample carried its RolloutInfo
        assert run["total_output_tokens"] == sum(len(s["token_ids"]) for s in run["samples"])
    saved = json.loads(next(tmp_path.glob("serve-bench-*.json")).read_text())
    assert saved["runs"][0]["output_throughput"] == result["runs"][0]["output_throughput"]
    assert len(list(tmp_path.glob("serve-bench-*-lengths.png"))) == 1
    assert len(list(tmp_path.glob("serve-bench-*-running.png"))) == 1


def test_serve_bench_single_requests_share_a_group(server, tmp_path):
    from vllm_rl.bench import serve as serve_bench

    result = serve_bench.main(["--base-url", server, "--prompts", "2", "--samples", "3",
                               "--group-as", "single", "--max-tokens", "32",
                               "--request-rate", "20", "--no-plots", "--out", str(tmp_path)])
    (run,) = result["runs"]
    assert run["num_requests"] == 6 and run["failed"] == 0 and run["completed"] == 6
    assert run["records"] == 6 and run["request_rate"] == 20


def test_das_routes(server, prompts):
    status, resp = _call(server, "/vllm_rl/das/prebuild",
                         {"problem_id": "cli-p1", "rollouts": ["1 + 2 = 3", [5, 6, 7, 8]],
                          "prompt": prompts[0]})
    assert status == 200 and resp == {"problem_id": "cli-p1", "rollouts": 2}
    status, stats = _call(server, "/vllm_rl/das/stats")
    assert status == 200 and "cli-p1" in stats["per_problem"]
    assert _call(server, "/vllm_rl/das/prebuild", {"rollouts": []})[0] == 400
    assert _call(server, "/vllm_rl/das/prebuild",
                 {"problem_id": "x", "rollouts": [[1, "a"]]})[0] == 400
    assert _call(server, "/vllm_rl/das/clear", raw=b"{oops")[0] == 400
    status, resp = _call(server, "/vllm_rl/das/clear", {"problem_id": "cli-p1"})
    assert status == 200 and resp == {"dropped": 1}
    status, resp = _call(server, "/vllm_rl/das/clear", raw=b"")
    assert status == 200 and resp["dropped"] >= 0


def _greedy(server, prompt, max_tokens=24):
    status, resp = _call(server, "/v1/completions", {
        "model": _call(server, "/v1/models")[1]["data"][0]["id"], "prompt": prompt,
        "max_tokens": max_tokens, "temperature": 0.0})
    assert status == 200, resp
    return resp["choices"][0]["text"]


def test_reload_weights_route(server, prompts):
    before = _greedy(server, prompts[1])
    status, resp = _call(server, "/vllm_rl/reload_weights", {})
    assert status == 200 and resp["reloaded"] is True, resp
    status, resp = _call(server, "/vllm_rl/reload_weights", {"path": str(MODEL_PATH)})
    assert status == 200 and resp["path"] == str(MODEL_PATH), resp
    for bad in ({"path": "/nonexistent/model"}, {"path": str(MODEL_PATH.parent)}, {"x": 1}):
        status, resp = _call(server, "/vllm_rl/reload_weights", bad)   # checked, engine untouched
        text = json.dumps(resp)
        assert status == 400 and ("reload_weights" in text or "body" in text), resp
    assert _greedy(server, prompts[1]) == before       # the same weights, reloaded


FLIGHT_TOKENS = MAX_MODEL_LEN - 64     # with ignore_eos: hundreds of steps after its first


def _halved_checkpoint(folder: Path) -> Path:
    """The embedded model with its MLP weights halved: another policy, same architecture
    (its greedy answers differ), as a local folder the reload route takes."""
    from safetensors.torch import load_file, save_file

    folder.mkdir()
    for f in MODEL_PATH.iterdir():
        if f.is_file() and f.suffix != ".safetensors":
            shutil.copy(f, folder / f.name)
    state = load_file(MODEL_PATH / "model.safetensors")
    save_file({k: v * 0.5 if ".mlp." in k else v for k, v in state.items()},
              folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def test_reload_weights_route_with_requests_in_flight(server, prompts, tmp_path):
    """The reload pauses the engine the way the caller asks: "wait" lets the requests in
    flight finish whole (no abort), "abort" ends them with finish_reason "abort".  A
    request sent while the "wait" reload is still draining is parked and served after it,
    on the new weights, never refused (vLLM 0.33's own pause_generation answers it 503).

    Ordered on what the engine reports, never on the clock: each reload is sent once the
    request in flight has streamed its first chunk (it is running, with hundreds of
    ignore_eos tokens still to go), and the request that must be parked is sent once the
    engine core says it is paused (vLLM's GET /is_paused).  The new weights are another
    checkpoint (MLP halved), so the parked request's greedy answer says which weights
    served it."""
    model = _call(server, "/v1/models")[1]["data"][0]["id"]
    halved = _halved_checkpoint(tmp_path / "halved")
    probe = prompts[3]
    before = _greedy(server, probe, 16)
    body = {"model": model, "prompt": prompts[2], "n": 8, "max_tokens": FLIGHT_TOKENS,
            "temperature": 1.0, "seed": 4, "ignore_eos": True, "return_token_ids": True,
            "vllm_xargs": rl_xargs(group={"size": 8})}

    def paused():
        status, resp = _call(server, "/is_paused")
        assert status == 200, resp
        return resp["is_paused"]

    try:
        # "wait": the reload waits for the flight; a request sent meanwhile is parked
        assert not paused()
        flight = Flight(server, body)
        flight.wait_started()
        reloading = Background(_call, server, "/vllm_rl/reload_weights",
                               {"mode": "wait", "path": str(halved)})
        wait_until(paused, "the engine core paused for the reload")
        assert not flight.done.is_set(), "the flight ended before the reload paused the engine"
        status, arrived = _call(server, "/v1/completions", {
            "model": model, "prompt": probe, "max_tokens": 16, "temperature": 0.0})
        assert status == 200, arrived                                      # never refused
        assert arrived["choices"][0]["finish_reason"] in ("length", "stop"), arrived
        status, resp = reloading.result()
        assert status == 200 and resp["reloaded"] is True, resp
        assert resp["mode"] == "wait" and resp["path"] == str(halved), resp
        code, out, _ = flight.result()
        assert code == 200, out
        assert len(out["choices"]) == 8
        for c in out["choices"]:                   # finished whole: every token, no abort
            info = RolloutInfo.from_openai_choice(c)
            assert c["finish_reason"] == "length" and info.reason is Reason.LENGTH, c
            assert len(c["token_ids"]) == info.length == FLIGHT_TOKENS
        assert not paused()
        after = _greedy(server, probe, 16)
        assert after != before, "the halved checkpoint answers the probe as the original does"
        assert arrived["choices"][0]["text"] == after, "the parked request ran on old weights"

        # "abort": the flight ends now, every sample of it with finish_reason "abort"
        flight = Flight(server, body)
        flight.wait_started()
        status, resp = _call(server, "/vllm_rl/reload_weights",
                             {"mode": "abort", "path": str(MODEL_PATH)})
        assert status == 200 and resp["mode"] == "abort", resp
        code, out, _ = flight.result()
        assert code == 200, out
        assert len(out["choices"]) == 8
        for c in out["choices"]:
            info = RolloutInfo.from_openai_choice(c)
            assert (c["finish_reason"], info.reason) == ("abort", Reason.ABORT), c
            assert info.length == len(c["token_ids"]) < FLIGHT_TOKENS
        assert _greedy(server, probe, 16) == before        # the original weights again
    finally:            # the served checkpoint again, whatever happened above
        _call(server, "/vllm_rl/reload_weights", {"path": str(MODEL_PATH)})
    status, resp = _call(server, "/vllm_rl/reload_weights", {"mode": "later"})
    assert status == 400 and "mode" in json.dumps(resp)
