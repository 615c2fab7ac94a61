"""RL counters on ``/metrics``: one count per sample, equal to what the records say."""
import json
from types import SimpleNamespace

import pytest

from server_fixture import call, metrics, shared_server, stream, wait_idle
from vllm_rl import Reason, RolloutInfo, rl_params, rl_xargs
from vllm_rl.outcome import record_of
from vllm_rl import metrics as rlm
from vllm_rl.metrics import total
from vllm_rl.task import MODEL_PATH

SAMPLES = "vllm_rl:samples_ended_total"


def _delta(after: dict, before: dict) -> dict:
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v != before.get(k, 0.0)}


def _expected(records: list[tuple[RolloutInfo, int]]) -> dict:
    """The counter increments that these (record, max_tokens) pairs must produce."""
    want: dict[str, float] = {}

    def add(key, v):
        if v:
            want[key] = want.get(key, 0.0) + v

    for info, max_tokens in records:
        r = info.reason.value
        add(f'{SAMPLES}{{reason="{r}"}}', 1)
        add(f'vllm_rl:sample_tokens_total{{reason="{r}"}}', info.length)
        add("vllm_rl:darts_cancelled_total", info.reason is Reason.DARTS_CANCELLED)
        add("vllm_rl:arrol_pruned_total", info.reason is Reason.ARROL_PRUNED)
        add("vllm_rl:arrol_scored_total", info.score is not None)
        add("vllm_rl:duet_eps_kept_total", info.eps_kept)
        add("vllm_rl:draft_tokens_proposed_total", info.draft_proposed or 0)
        add("vllm_rl:draft_tokens_accepted_total", info.draft_accepted or 0)
        add("vllm_rl:draft_rounds_total", info.draft_rounds or 0)
        add("vllm_rl:draft_off_steps_total", info.draft_off_steps or 0)
        if info.reason.early:
            add(f'vllm_rl:tokens_saved_estimated_total{{reason="{r}"}}',
                max(0, max_tokens - info.length))
        if info.reason.natural:                      # the natural-length histogram
            add("vllm_rl:sample_length_count", 1)
            add("vllm_rl:sample_length_sum", info.length)
            for le in rlm.LENGTH_BUCKETS:
                add(f'vllm_rl:sample_length_bucket{{le="{float(le)}"}}', info.length <= le)
            add('vllm_rl:sample_length_bucket{le="+Inf"}', 1)
    return want


def _rl(delta: dict) -> dict:
    """The counters' increments (the gauges hold last values, compared on their own)."""
    gauges = {rlm.NAMESPACE + name for name in rlm.GAUGES}
    return {k: v for k, v in delta.items() if k.startswith(rlm.NAMESPACE) and k not in gauges}


# ------------------------------------------------------------------------- in-process
def test_counters_are_registered_once_and_survive_vllms_unregistering():
    from prometheus_client import REGISTRY
    from vllm.v1.metrics.prometheus import unregister_vllm_metrics

    assert rlm.counters() is rlm.counters()
    unregister_vllm_metrics()          # what every PrometheusStatLogger does first
    names = set(REGISTRY._names_to_collectors)
    for name in rlm.COUNTERS:
        assert rlm.NAMESPACE + name in names
    snap = rlm.snapshot()
    assert all(f'{SAMPLES}{{reason="{r.value}"}}' in snap for r in Reason)
    assert all(k.startswith("vllm_rl:") for k in snap)


def test_observe_output_counts_records_and_flagged_samples_without_one():
    """A record counts by its fields; a flagged sample ended by the front end (stop
    string, client abort) counts by vLLM's finish reason; a flagless one not at all."""
    from vllm.v1.engine import FinishReason

    detok = SimpleNamespace(num_output_tokens=lambda: 7)
    flagged = SimpleNamespace(max_tokens_param=100, detokenizer=detok, vllm_rl_flagged=True)
    stock = SimpleNamespace(max_tokens_param=100, detokenizer=detok)
    records = [
        RolloutInfo(Reason.DUET_ABORTED, 30, 0.0, keep_prob=0.05, draft_proposed=8,
                    draft_accepted=3, draft_rounds=2, draft_off_steps=5),
        RolloutInfo(Reason.EOS, 50, 20.0, keep_prob=0.05),              # eps-kept
        RolloutInfo(Reason.DARTS_CANCELLED, 40, 0.0, score=0.3, q=0.5, p=0.5, pruned=False),
        RolloutInfo(Reason.ARROL_PRUNED, 16, 0.0, score=0.1, pruned=True),
        RolloutInfo(Reason.LENGTH, 100, 1.0),
    ]
    before = rlm.snapshot()
    for info in records:
        rlm.observe_output(flagged, FinishReason.ABORT, info.stop, info)
    rlm.observe_output(flagged, FinishReason.STOP, "=", None)
    rlm.observe_output(flagged, FinishReason.ABORT, None, None)
    rlm.observe_output(flagged, FinishReason.ERROR, None, None)
    rlm.observe_output(stock, FinishReason.STOP, None, None)
    rlm.observe_output(stock, FinishReason.LENGTH, None, None)
    gauges = {rlm.NAMESPACE + name for name in rlm.GAUGES}        # last values, not counts
    got = {k: v for k, v in _delta(rlm.snapshot(), before).items() if k not in gauges}
    want = _expected([(i, 100) for i in records]
                     + [(RolloutInfo(Reason.STOP, 7), 100), (RolloutInfo(Reason.ABORT, 7), 100)])
    assert got == want
    assert got['vllm_rl:tokens_saved_estimated_total{reason="darts_cancelled"}'] == 60


def test_arrol_gate_gauge_follows_the_last_scored_record():
    from vllm.v1.engine import FinishReason

    flagged = SimpleNamespace(max_tokens_param=100, vllm_rl_flagged=True,
                              detokenizer=SimpleNamespace(num_output_tokens=lambda: 7))
    for p, open_ in ((0.5, 1.0), (None, 0.0)):
        info = RolloutInfo(Reason.EOS, 40, 1.0, score=0.6, q=0.5, p=p)
        rlm.observe_output(flagged, FinishReason.STOP, None, info)
        assert rlm.snapshot()["vllm_rl:arrol_gate_open"] == open_


def test_head_auc_gauge_shows_the_last_calibrated_record():
    from vllm.v1.engine import FinishReason

    flagged = SimpleNamespace(max_tokens_param=100, vllm_rl_flagged=True,
                              detokenizer=SimpleNamespace(num_output_tokens=lambda: 7))
    assert "vllm_rl:arrol_head_auc" in rlm.snapshot()            # registered with the rest
    for auc in (0.71, 0.83):
        info = RolloutInfo(Reason.EOS, 40, 1.0, score=0.6, q=0.5, p=0.5, head_version=3,
                           head_auc=auc)
        rlm.observe_output(flagged, FinishReason.STOP, None, info)
        assert rlm.snapshot()["vllm_rl:arrol_head_auc"] == auc
    assert RolloutInfo.decode(info.encode()).head_auc == 0.83


def test_duet_gauges_follow_the_last_duet_record():
    from vllm.v1.engine import FinishReason

    flagged = SimpleNamespace(max_tokens_param=100, vllm_rl_flagged=True,
                              detokenizer=SimpleNamespace(num_output_tokens=lambda: 7))
    for open_, share in ((True, None), (False, 0.16), (True, 0.03)):
        info = RolloutInfo(Reason.EOS, 40, 1.0, keep_prob=1.0, gate_open=open_,
                           markerless_share=share)
        rlm.observe_output(flagged, FinishReason.STOP, None, info)
        snap = rlm.snapshot()
        assert snap["vllm_rl:duet_gate_open"] == float(open_)
        if share is not None:
            assert snap["vllm_rl:duet_markerless_share"] == share
    assert RolloutInfo.decode(info.encode()).markerless_share == 0.03


def test_parse_and_total_read_a_metrics_page():
    page = ("# TYPE vllm:num_requests_running gauge\n"
            'vllm:num_requests_running{engine="0",model_name="m"} 2.0\n'
            'vllm:num_requests_running{engine="1",model_name="m"} 1.0\n'
            "# TYPE vllm_rl:samples_ended counter\n"
            'vllm_rl:samples_ended_total{reason="eos"} 5.0\n'
            'vllm_rl:samples_ended_created{reason="eos"} 1.7e9\n'
            "# TYPE other gauge\nother 3.0\n")
    flat = rlm.parse(page)
    assert total(flat, "vllm:num_requests_running") == 3
    assert total(flat, "vllm:num_requests_running", engine="1") == 1
    assert total(flat, SAMPLES, reason="eos") == 5
    assert not any(k.startswith("other") or "_created" in k for k in flat)


@pytest.mark.engine
def test_offline_llm_counts_in_its_own_process(rl_llm, prompts):
    from vllm import SamplingParams

    before = rlm.snapshot()
    sp = SamplingParams(n=8, temperature=1.0, max_tokens=96, seed=5,
                        extra_args=rl_params(group={"size": 4}, darts={"mode": "shortest"},
                                             duet={"k1": 8, "k2": 24, "grace": 0, "eps": 0.5}))
    outs = rl_llm.generate(prompts[:2], sp, use_tqdm=False)
    stock = rl_llm.generate(prompts[:1], SamplingParams(max_tokens=8), use_tqdm=False)
    assert stock[0].outputs[0].rollout_info.reason in (Reason.EOS, Reason.LENGTH)
    records = [record_of(c) for o in outs for c in o.outputs]
    assert all(records) and len(records) == 16
    assert _rl(_delta(rlm.snapshot(), before)) == _expected([(i, 96) for i in records])


# ------------------------------------------------------------------------- live server
@pytest.fixture(scope="module")
def server():
    return shared_server()


def _body(prompt, **kw):
    return {"model": str(MODEL_PATH), "prompt": prompt, "temperature": 1.0, "max_tokens": 64,
            "seed": 1, "return_token_ids": True, **kw}


@pytest.mark.engine
def test_server_metrics_equal_the_records(server, prompts):
    """Every technique's counters on the API server's /metrics (engine core in its own
    process) move by exactly what the returned records say."""
    from vllm_rl.arrol.rule import BINS

    cal = {"pos": [0] * BINS, "neg": [0] * BINS, "alpha": 1.0, "prior": 0.5, "delta": 0.0,
           "bins": BINS}
    assert call(server, "/vllm_rl/arrol", {"calibration": cal})[0] == 200   # p = 0.5: prunes
    wait_idle(server)
    before = metrics(server)
    requests = [
        (dict(n=8, max_tokens=160,
              vllm_xargs=rl_xargs(group={"size": 3}, darts={"mode": "shortest"}))),
        (dict(n=6, vllm_xargs=rl_xargs(duet={"k1": 4, "k2": 12, "grace": 0, "eps": 0.5}))),
        (dict(n=4, vllm_xargs=rl_xargs(das={"problem_id": "metrics-1"}))),
        (dict(n=8, vllm_xargs=rl_xargs(arrol={"l_detect": 6}))),
        (dict(n=4, stop=["="], vllm_xargs=rl_xargs(duet={}))),        # front-end stop string
        (dict(n=2)),                                                   # flagless: not counted
    ]
    records = []
    for i, kw in enumerate(requests):
        body = _body(prompts[10 + i], **kw)
        status, resp = call(server, "/v1/completions", body)
        assert status == 200, resp
        for c in resp["choices"]:
            info = RolloutInfo.from_openai_choice(c)
            assert info.length == len(c["token_ids"])
            if "vllm_xargs" in kw:
                records.append((info, body["max_tokens"]))
            else:
                assert "rollout_info" not in c
    status, resp, aborted = stream(server, _body(prompts[20], n=3, max_tokens=300,
                                                 ignore_eos=True,
                                                 vllm_xargs=rl_xargs(group={"size": 3})),
                                   stop_after=1)
    assert status == 200 and aborted
    after = wait_idle(server)
    assert call(server, "/vllm_rl/arrol", {"cold_start": True})[0] == 200
    got = _rl(_delta(after, before))
    aborts = got.pop('vllm_rl:sample_tokens_total{reason="abort"}', 0.0)
    assert got.pop(f'{SAMPLES}{{reason="abort"}}') == 3 and aborts < 3 * 300
    want = _expected(records)
    assert got == want, json.dumps({"got": got, "want": want}, indent=1)
    reasons = {i.reason for i, _ in records}
    assert {Reason.DARTS_CANCELLED, Reason.ARROL_PRUNED, Reason.STOP} <= reasons, reasons
    assert want["vllm_rl:draft_tokens_proposed_total"] > 0
    assert want["vllm_rl:duet_eps_kept_total"] > 0 and Reason.DUET_ABORTED in reasons
    assert total(after, "vllm:num_requests_running") == 0


@pytest.mark.engine
def test_advise_reads_the_live_servers_metrics(server, prompts, capsys):
    """``vllm-rl advise --metrics`` on a live server that has served flagged requests."""
    from vllm_rl.cli.advise import main

    body = _body(prompts[30], n=4, vllm_xargs=rl_xargs(das={"problem_id": "advise-1"}))
    assert call(server, "/v1/completions", body)[0] == 200
    wait_idle(server)
    main(["--metrics", server, "--json"])
    data = json.loads(capsys.readouterr().out)
    regime = data["regime"]
    assert regime["samples"] >= 4 and regime["length_p50"] is not None
    assert {v["technique"] for v in data["verdicts"]} == {"arrol", "duet", "das", "darts"}
