"""A weight reload never lets a request read KV computed with older weights.

The engine core runs in-process and is stepped by hand (``LLMEngine.add_request`` /
``step``: one engine step each), so "under load" is exact: a request holds KV blocks at
a known step when the reload comes, with no thread and no clock.  vLLM's own ``reset_prefix_cache`` refuses while a request holds
blocks ("some blocks are not freed yet"), which left every cached block of the old
weights open to new hits; the RL engine recomputes the requests in flight instead
(``RLSchedulerMixin.reset_prefix_cache``).  Hits are read from vLLM's own
``RequestOutput.num_cached_tokens``.
"""
from __future__ import annotations

import pytest
from vllm import SamplingParams

from vllm_rl import rl_params
from vllm_rl.outcome import RolloutInfo

pytestmark = pytest.mark.engine


def _ids(seed: int, n: int) -> list[int]:
    """A prompt of ``n`` token ids of the embedded model's vocabulary (several KV blocks)."""
    return [3 + (seed * 7919 + 31 * i) % 40 for i in range(n)]


class _Driver:
    """Requests added to the engine and stepped until a condition holds."""

    def __init__(self, llm) -> None:
        self.engine = llm.llm_engine
        self.done: dict[str, object] = {}
        self.latest: dict[str, object] = {}
        self.count = 0

    def add(self, ids: list[int], max_tokens: int, flags: bool = True) -> str:
        self.count += 1
        rid = f"reload-cache-{self.count}"
        sp = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True,
                            extra_args=rl_params() if flags else None)
        self.engine.add_request(rid, {"prompt_token_ids": ids}, sp)
        return rid

    def step_until(self, done) -> None:
        for _ in range(10_000):              # a bound on steps, never on time
            if done():
                return
            for out in self.engine.step():
                self.latest[out.request_id] = out
                if out.finished:
                    self.done[out.request_id] = out
        raise AssertionError("the engine did not get there in 10,000 steps")

    def run(self, ids: list[int], max_tokens: int = 1):
        rid = self.add(ids, max_tokens)
        self.step_until(lambda: rid in self.done)
        return self.done[rid]

    def tokens(self, rid: str) -> int:
        out = self.latest.get(rid)
        return len(out.outputs[0].token_ids) if out is not None else 0


def _weights():
    from safetensors.torch import load_file

    from vllm_rl.task import MODEL_PATH

    return load_file(str(MODEL_PATH / "model.safetensors"))


def test_reload_under_load_serves_no_old_kv(inproc_llm):
    from vllm_rl.weights import load_weights

    original = _weights()
    changed = {k: (v * 1.25 if v.is_floating_point() and v.dim() == 2 else v)
               for k, v in original.items()}
    drive = _Driver(inproc_llm)
    p, q = _ids(1, 300), _ids(2, 200)
    try:
        drive.run(p, max_tokens=2)                       # P's blocks cached, then free
        assert drive.run(p).num_cached_tokens > 0, "prefix caching is off: the test shows nothing"

        held = drive.add(q, max_tokens=48)               # in flight: holds Q's blocks
        drive.step_until(lambda: drive.tokens(held) >= 5)
        at_reload = drive.tokens(held)
        report = load_weights(inproc_llm, changed)
        assert report["prefix_cache_reset"] is True, report
        assert report["requests_recomputed"] == 1, report
        assert report["cached_blocks_dropped"] > 0, report
        version = report["weight_version"]
        assert report["label"] == str(version)

        after = drive.run(p)                             # P after the reload: no old block
        assert after.num_cached_tokens == 0, after.num_cached_tokens
        assert RolloutInfo.from_completion(after.outputs[0]).weight_version == version

        drive.step_until(lambda: held in drive.done)    # the request kept across it
        out = drive.done[held].outputs[0]
        info = RolloutInfo.from_completion(out)
        assert len(out.token_ids) == 48
        assert info.weight_versions == [[version - 1, 0], [version, at_reload]], info
        # vLLM's own spans (the label set by the sync) agree with the record
        spans = [(s.version, s.start) for s in out.weight_versions or []]
        assert spans[-1] == (str(version), at_reload), spans

        # A framework's own sync (verl, OpenRLHF, TRL: reset_prefix_cache after the load)
        # while a request holds blocks: the reset happens, the old blocks go.
        drive.run(p)                                     # P cached again (new weights)
        held = drive.add(q, max_tokens=16)
        drive.step_until(lambda: drive.tokens(held) >= 2)
        assert inproc_llm.reset_prefix_cache() is True
        assert drive.run(p).num_cached_tokens == 0
        drive.step_until(lambda: held in drive.done)
        info = RolloutInfo.from_completion(drive.done[held].outputs[0])
        assert [v for v, _ in info.weight_versions] == [version, version + 1], info
    finally:
        load_weights(inproc_llm, original)                   # the shared engine as it was
    assert drive.run(p).outputs[0].token_ids                 # still serving


def test_a_flagless_request_in_flight_is_recomputed_without_a_record(inproc_llm):
    """A request without flags is recomputed by the sync too (the cache is shared), but
    keeps vLLM's own output: no record, vLLM's weight-version spans only."""
    from vllm_rl.weights import weight_sync

    drive = _Driver(inproc_llm)
    held = drive.add(_ids(3, 200), max_tokens=12, flags=False)
    drive.step_until(lambda: drive.tokens(held) >= 3)
    report = weight_sync(inproc_llm)
    assert report["prefix_cache_reset"] is True and report["requests_recomputed"] == 1
    drive.step_until(lambda: held in drive.done)
    out = drive.done[held].outputs[0]
    assert len(out.token_ids) == 12
    assert getattr(out, "rollout_info", None) is None


def _stream_until_first_token(base: str, body: dict, started, out: dict) -> None:
    """A streamed completion: ``started`` is set once its first token has arrived (the
    engine is generating it); ``out`` gets its last chunk's choice."""
    import http.client
    import json

    host, port = base.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=300)
    try:
        conn.request("POST", "/v1/completions", json.dumps({**body, "stream": True}),
                     {"Content-Type": "application/json"})
        resp = conn.getresponse()
        out["status"] = resp.status
        for line in resp:
            line = line.strip()
            if not line.startswith(b"data:") or line[5:].strip() == b"[DONE]":
                continue
            for choice in json.loads(line[5:]).get("choices", []):
                out["tokens"] = out.get("tokens", 0) + len(choice.get("token_ids") or [1])
                out["choice"] = choice
            started.set()
    finally:
        started.set()
        conn.close()


def test_reload_route_keep_under_load(tmp_path):
    """``POST /vllm_rl/reload_weights`` in ``keep`` mode, a request in flight, on the
    server: the answer says what the cache sync did, ``/metrics`` counts it, vLLM's own
    prefix-cache hit counter shows no hit on the old weights' blocks afterwards, and the
    request in flight says in its record where the new weights began."""
    import shutil
    import threading

    from safetensors.torch import save_file

    from server_fixture import call, metrics, shared_server, wait_idle
    from vllm_rl.flags import rl_xargs
    from vllm_rl.metrics import total
    from vllm_rl.task import MODEL_PATH

    base = shared_server()
    model = call(base, "/v1/models")[1]["data"][0]["id"]
    folder = tmp_path / "changed"
    shutil.copytree(MODEL_PATH, folder)
    save_file({k: (v * 1.25 if v.is_floating_point() and v.dim() == 2 else v).contiguous()
               for k, v in _weights().items()}, str(folder / "model.safetensors"))
    p, q = _ids(4, 300), _ids(5, 200)

    def hits_of(prompt) -> float:
        before = total(wait_idle(base), "vllm:prefix_cache_hits_total")
        status, resp = call(base, "/v1/completions", {"model": model, "prompt": prompt,
                                                      "max_tokens": 1, "temperature": 0.0})
        assert status == 200, resp
        return total(wait_idle(base), "vllm:prefix_cache_hits_total") - before

    try:
        hits_of(p)
        assert hits_of(p) > 0, "prefix caching is off on the server: the test shows nothing"
        syncs = total(metrics(base), "vllm_rl:weight_syncs_total", mode="keep")
        started, out = threading.Event(), {}
        body = {"model": model, "prompt": q, "max_tokens": 300, "ignore_eos": True,
                "temperature": 0.0, "return_token_ids": True, "vllm_xargs": rl_xargs()}
        flight = threading.Thread(target=_stream_until_first_token,
                                  args=(base, body, started, out))
        flight.start()
        assert started.wait(300) and out.get("status") == 200, out
        status, resp = call(base, "/vllm_rl/reload_weights",
                            {"path": str(folder), "mode": "keep"}, timeout=300)
        flight.join(300)
        assert status == 200 and resp["cache"]["prefix_cache_reset"] is True, resp
        assert resp["cache"]["cached_blocks_dropped"] > 0, resp
        assert hits_of(p) == 0, "a request after the reload hit a block of the old weights"
        assert total(metrics(base), "vllm_rl:weight_syncs_total", mode="keep") == syncs + 1
        info = RolloutInfo.from_json(out["choice"]["rollout_info"])
        assert info is not None and info.length == 300, out
        across = resp["cache"]["flagged_samples_across"]
        # the request was in flight at the reload unless it had already ended by then
        assert across <= 1 and (info.weight_versions is not None) == (across == 1), (info, resp)
        if info.weight_versions is not None:
            (v0, s0), (v1, s1) = info.weight_versions
            assert (s0, v1) == (0, resp["cache"]["weight_version"]) and 0 < s1 < 300, info
    finally:
        status, resp = call(base, "/vllm_rl/reload_weights", {"path": str(MODEL_PATH)},
                            timeout=300)
        assert status == 200, resp


def test_seeded_requests_recomputed_in_chunks_after_a_sync(inproc_llm):
    """Sampled requests with their own seed, in flight at a sync, recompute in chunked
    prefills (more tokens than one step's budget): vLLM 0.32's CPU runner would rewind
    their generators with a CUDA-only call and die (``patches/input_batch.py``)."""
    from vllm_rl.weights import weight_sync

    engine = inproc_llm.llm_engine
    budget = engine.vllm_config.scheduler_config.max_num_batched_tokens
    drive = _Driver(inproc_llm)
    rids = []
    for i in range(budget // 200 + 2):          # together more than one step's budget
        rid = f"seeded-{i}"
        engine.add_request(rid, {"prompt_token_ids": _ids(10 + i, 200)}, SamplingParams(
            temperature=1.0, seed=i, max_tokens=40, ignore_eos=True,
            extra_args=rl_params()))
        rids.append(rid)
    drive.step_until(lambda: all(drive.tokens(r) >= 2 for r in rids))
    report = weight_sync(inproc_llm)
    assert report["requests_recomputed"] == len(rids), report
    drive.step_until(lambda: all(r in drive.done for r in rids))
    for rid in rids:
        out = drive.done[rid].outputs[0]
        assert len(out.token_ids) == 40
        assert RolloutInfo.from_completion(out).weight_versions is not None
