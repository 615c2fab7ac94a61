"""The RL scheduler's rules, driven step by step with hand-built vLLM outputs.

As vLLM tests its own scheduler (``tests/v1/core/utils.py``: ``create_scheduler``,
``create_requests``): a real :class:`~vllm_rl.engine.scheduler.RLSyncScheduler` on a
hand-built ``VllmConfig`` (the embedded model's config, CPU) and ``KVCacheConfig``, no
engine, no worker.  Each step is ``schedule()`` and then ``update_from_output`` with a
``ModelRunnerOutput`` whose sampled tokens (and ARRoL verdicts) the test chooses, so every
early end, record and freed block is checked at the exact step the rule says.
"""
from __future__ import annotations

import pytest
from vllm.sampling_params import SamplingParams
from vllm.v1.engine import FinishReason
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request, RequestStatus

from vllm_rl import rl_params
from vllm_rl.arrol.rule import ArrolVerdict
from vllm_rl.darts.rule import annotate_group
from vllm_rl.duet.rule import seeded_coin
from vllm_rl.bench.overhead.scheduler import standalone_scheduler
from vllm_rl.engine.scheduler import RLSyncScheduler
from vllm_rl.flags import KEY, read
from vllm_rl.outcome import Reason, RolloutInfo
from vllm_rl.step_output import attach

EOS = 0          # the embedded model's eos_token_id
TOK = 7          # any other token
NUM_BLOCKS = 300
PROMPT = [3, 4, 5, 6, 8, 9]


@pytest.fixture
def sched() -> RLSyncScheduler:
    return standalone_scheduler(RLSyncScheduler, max_num_seqs=16, max_model_len=512,
                                num_blocks=NUM_BLOCKS, max_num_batched_tokens=1024,
                                prefix_caching=True)


# ---------------------------------------------------------------- helpers
def request(rid: str, flags: dict | None = None, max_tokens: int = 64, seed: int | None = 1,
            extra_args: dict | None = None) -> Request:
    """A request as the front end hands it to the engine core: canonical flags
    (``patches/input_processor.py``), the model's EOS."""
    if flags is not None:
        extra_args = {KEY: read(flags, n=1, default_group_id=rid).canonical()}
    params = SamplingParams(max_tokens=max_tokens, seed=seed, extra_args=extra_args)
    params.update_from_generation_config({}, eos_token_id=EOS)
    return Request(rid, list(PROMPT), params, None)


def step(sched, tokens: dict[str, list[int]] | None = None, arrol: dict | None = None):
    """One engine step: every scheduled request samples ``tokens[rid]`` (default one
    ordinary token).  Returns ``{rid: EngineCoreOutput}`` of the requests that finished
    in the step (vLLM also emits the others' new tokens; those are left out)."""
    so = sched.schedule()
    ids = list(so.num_scheduled_tokens)
    out = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                            sampled_token_ids=[list((tokens or {}).get(r, [TOK])) for r in ids])
    if arrol:
        attach(out).verdicts.update(arrol)     # as the ARRoL scorer does
    return {o.request_id: o for eco in sched.update_from_output(so, out).values()
            for o in eco.outputs if o.finish_reason is not None}


def info(output) -> RolloutInfo:
    record = RolloutInfo.decode(output.stop_reason)
    assert record is not None, output.stop_reason
    return record


def free_blocks(sched) -> int:
    return sched.kv_cache_manager.block_pool.get_num_free_blocks()


def n_out(sched, rid: str) -> int:
    return sched.requests[rid].num_output_tokens


def darts_group(gid: str, m: int, m_prime: int, **more) -> dict:
    return rl_params(group={"id": gid, "size": m, "redundant": m_prime},
                     darts={"mode": "shortest"}, **more)


# ---------------------------------------------------------------- DARTS early stop
def test_darts_stops_exactly_when_the_m_shortest_are_known(sched):
    idle = free_blocks(sched)
    flags = darts_group("g", 2, 4)
    for rid in "abc":
        sched.add_request(request(rid, flags))
    step(sched)
    step(sched)                                          # a, b, c: 2 tokens
    sched.add_request(request("d", flags))               # d arrives two steps late
    out = step(sched, {"a": [EOS]})                      # a ends: length 3, rank 1
    assert info(out["a"]).reason is Reason.EOS and info(out["a"]).finish_rank == 1
    assert out["a"].finish_reason is FinishReason.STOP
    step(sched)
    out = step(sched, {"b": [EOS]})                      # b ends at 5: M = 2 valid known
    assert info(out["b"]).reason is Reason.EOS and info(out["b"]).length == 5
    # d has 3 tokens < 5 = the M-th shortest: it could still end shorter, so the group
    # stays open (exact shortest-M), and c (5 tokens) runs on with it.
    assert n_out(sched, "d") == 3 and n_out(sched, "c") == 5
    assert not sched.rl_groups.groups["g"].stopped and set(out) == {"b"}
    out = step(sched)                                    # d: 4 tokens, still < 5
    assert out == {} and n_out(sched, "d") == 4
    out = step(sched)                                    # d: 5 tokens → the M shortest are known
    assert set(out) == {"c", "d"}
    for rid, length in (("c", 7), ("d", 5)):
        o, rec = out[rid], info(out[rid])
        assert o.finish_reason is FinishReason.ABORT
        assert rec.reason is Reason.DARTS_CANCELLED and rec.weight == 0.0
        assert rec.length == length and rec.group_id == "g"
    # same step: gone from the scheduler, blocks back, group left the registry
    assert not sched.requests and not sched.rl_members and len(sched.rl_groups) == 0
    assert free_blocks(sched) == idle
    assert sched.rl_stats["groups_stopped"] == 1
    assert sched.rl_stats["stop_wait_steps"] == 2        # two steps past the M-th valid end


def test_darts_waits_for_a_member_not_yet_arrived(sched):
    flags = darts_group("g", 1, 2)
    sched.add_request(request("a", flags))
    step(sched)
    out = step(sched, {"a": [EOS]})                      # M = 1 valid, but M' = 2: one missing
    assert info(out["a"]).reason is Reason.EOS
    assert not sched.rl_groups.groups["g"].stopped
    sched.add_request(request("b", flags))               # a late arrival, 0 tokens
    out = step(sched)
    assert "b" not in out and n_out(sched, "b") == 1     # 1 < 2: could still be shorter
    out = step(sched)                                    # b at 2 = the shortest's length
    assert info(out["b"]).reason is Reason.DARTS_CANCELLED
    assert not sched.requests


def test_darts_multi_token_step_crossing_the_mth_length(sched):
    """A DAS-like step brings several tokens at once: the stop is seen at that step."""
    idle = free_blocks(sched)
    flags = darts_group("g", 1, 2)
    sched.add_request(request("a", flags))
    step(sched)
    sched.add_request(request("b", flags))
    step(sched)
    step(sched)
    out = step(sched, {"a": [EOS]})                      # a ends at 4; b has 3
    assert info(out["a"]).length == 4 and "b" not in out
    out = step(sched, {"b": [TOK, TOK, TOK]})            # b: 3 → 6 in one step
    rec = info(out["b"])
    assert rec.reason is Reason.DARTS_CANCELLED and rec.length == 6
    assert not sched.requests and free_blocks(sched) == idle


def test_darts_shorter_late_finisher_takes_the_slot(sched):
    """A lagging sibling that ends shorter than the M-th is selected, not cancelled."""
    flags = darts_group("g", 1, 3)
    sched.add_request(request("a", flags))
    sched.add_request(request("b", flags))
    step(sched)
    step(sched)
    sched.add_request(request("c", flags))
    step(sched)
    out = step(sched, {"a": [EOS]})                      # a: 4; c has 2
    assert "b" not in out and "c" not in out
    out = step(sched, {"c": [EOS]})                      # c ends at 3 < 4
    assert info(out["c"]).reason is Reason.EOS and info(out["c"]).finish_rank == 2
    assert info(out["b"]).reason is Reason.DARTS_CANCELLED   # b (5) > 3: stop now
    assert not sched.requests


def test_a_reused_group_id_never_merges_two_live_groups(sched):
    """A group holds M' arrivals: the same id sent again while the first group is live
    (a dataset index reused at the next step) begins a second group, and each stops on
    its own M shortest with its own records."""
    first, second = darts_group("7", 1, 2), darts_group("7", 1, 2)
    for rid in ("a1", "a2"):
        sched.add_request(request(rid, first))
    step(sched)
    for rid in ("b1", "b2"):                           # the id again, first group live
        sched.add_request(request(rid, second))
    assert len({id(sched.rl_members[r].group) for r in ("a1", "b1")}) == 2
    out = step(sched, {"a1": [EOS]})                   # the first group's M = 1 valid
    assert info(out["a1"]).reason is Reason.EOS         # length 2, and a2 (2 tokens)
    assert info(out["a2"]).reason is Reason.DARTS_CANCELLED   # can be no shorter
    assert n_out(sched, "b1") == 1 and n_out(sched, "b2") == 1   # the second: untouched
    out = step(sched, {"b2": [EOS]})
    assert info(out["b2"]).reason is Reason.EOS and info(out["b1"]).reason is \
        Reason.DARTS_CANCELLED
    assert info(out["b2"]).finish_rank == 1


# ---------------------------------------------------------------- DUET gate
DUET = {"k1": 2, "k2": 4, "grace": 2, "pattern": "NEVER_SEEN_MARKER"}


def _duet_eps(rid: str, seed: int, keep: bool) -> float:
    coin = seeded_coin(seed, PROMPT, rid)
    assert 0.01 < coin < 0.99, coin
    return (coin + 1.0) / 2 if keep else coin / 2       # kept iff coin < eps


def test_duet_gate_aborts_at_k2_plus_g(sched):
    eps = _duet_eps("a", 1, keep=False)
    sched.add_request(request("a", rl_params(duet={**DUET, "eps": eps})))
    for _ in range(5):
        assert step(sched) == {}
    out = step(sched)                                    # 6 = K2 + G tokens, no marker
    o, rec = out["a"], info(out["a"])
    assert o.finish_reason is FinishReason.ABORT
    assert rec.reason is Reason.DUET_ABORTED and rec.weight == 0.0 and rec.length == 6
    assert (rec.k1, rec.k2, rec.keep_prob, rec.marker_pos) == (2, 4, eps, None)
    assert not sched.requests


def test_duet_coin_keeps_with_inverse_weight(sched):
    eps = _duet_eps("a", 1, keep=True)
    sched.add_request(request("a", rl_params(duet={**DUET, "eps": eps})))
    for _ in range(8):                                   # past the gate: runs on
        assert step(sched) == {}
    out = step(sched, {"a": [EOS]})
    rec = info(out["a"])
    assert rec.reason is Reason.EOS and rec.length == 9
    assert rec.keep_prob == pytest.approx(eps) and rec.weight == pytest.approx(1 / eps)


def test_duet_abort_inside_darts_does_not_count(sched):
    """Composition rule: inside a DARTS group the gate keeps its eps; an aborted sample is
    never valid, so it neither stops the group nor is cancelled."""
    group = darts_group("g", 1, 2)
    eps = _duet_eps("a", 1, keep=False)
    sched.add_request(request("a", darts_group("g", 1, 2, duet={**DUET, "eps": eps})))
    sched.add_request(request("b", group))
    for _ in range(5):
        step(sched)
    out = step(sched)                                    # K2 + G: the coin aborts it
    rec = info(out["a"])
    assert rec.reason is Reason.DUET_ABORTED and rec.weight == 0.0
    assert rec.keep_prob == pytest.approx(eps) and rec.group_id == "g"
    assert "b" not in out and not sched.rl_groups.groups["g"].stopped
    step(sched)
    out = step(sched, {"b": [EOS]})
    assert info(out["b"]).reason is Reason.EOS and info(out["b"]).finish_rank == 2
    assert not sched.requests and sched.rl_stats["groups_stopped"] == 0
    assert sched.rl_stats["groups_resolved"] == 1


def test_duet_eps_kept_inside_darts_is_outside_its_pool(sched):
    """Composition rule: a sample DUET's coin keeps past the gate stands for the
    marker-less tail (weight 1/eps): it never counts toward M (ending first, it stops
    nothing), is never cancelled by the early stop, and is always in the training group."""
    from conftest import shortest_violations

    eps = {rid: _duet_eps(rid, 1, keep=True) for rid in "ad"}
    for rid in "abcd":
        more = {"duet": {**DUET, "eps": eps[rid]}} if rid in eps else {}
        sched.add_request(request(rid, darts_group("g", 1, 4, **more)))
    for _ in range(6):                                   # a and d pass the gate, kept
        assert step(sched) == {}
    out = step(sched, {"a": [EOS]})                      # a ends first: not DARTS's M
    rec_a = info(out["a"])
    assert rec_a.reason is Reason.EOS and rec_a.eps_kept
    assert rec_a.weight == pytest.approx(1 / eps["a"])
    assert not sched.rl_groups.groups["g"].stopped and set(out) == {"a"}
    out = step(sched, {"b": [EOS]})                      # b: the M = 1 shortest valid
    assert set(out) == {"b", "c"}                        # c cancelled, d runs on
    rec_b, rec_c = info(out["b"]), info(out["c"])
    assert rec_c.reason is Reason.DARTS_CANCELLED and "d" in sched.requests
    assert sched.rl_stats["groups_stopped"] == 1
    assert step(sched) == {}
    out = step(sched, {"d": [EOS]})
    rec_d = info(out["d"])
    assert rec_d.reason is Reason.EOS and rec_d.length == 10 and rec_d.eps_kept
    assert rec_d.weight == pytest.approx(1 / eps["d"])
    assert not sched.requests and len(sched.rl_groups) == 0
    marked = annotate_group([rec_a, rec_b, rec_c, rec_d], size=1, k=0, early_stop=True)
    assert [r.selection for r in marked] == ["eps_kept", "shortest", None, "eps_kept"]
    assert [r.weight for r in marked] == [rec_a.weight, 1.0, 0.0, rec_d.weight]
    assert shortest_violations(marked, 1) == []


def test_duet_eps_one_outside_darts_keeps(sched):
    sched.add_request(request("a", rl_params(duet={**DUET, "eps": 1.0})))
    for _ in range(7):
        assert step(sched) == {}
    assert info(step(sched, {"a": [EOS]})["a"]).reason is Reason.EOS


def test_duet_trims_at_its_marker_read_from_token_ids(sched, monkeypatch):
    """The marker is matched on the tokens' bytes (the vocabulary read once): the
    scheduler never decodes a sample."""
    from vllm_rl.task.tokenizer import MARK, vocab

    ids = vocab()
    tokenizer = sched._load_tokenizer()

    def no_decode(*args, **kwargs):
        raise AssertionError("the scheduler decoded a sample")

    monkeypatch.setattr(type(tokenizer), "decode", no_decode)
    sched.add_request(request("a", rl_params(duet={"k1": 0, "k2": 50, "poll": 1,
                                                   "pattern": r"boxed\{ 7 \}"})))
    assert step(sched, {"a": [ids["\\boxed{"]]}) == {}
    assert step(sched, {"a": [ids[MARK + "7"]]}) == {}
    out = step(sched, {"a": [ids[MARK + "}"]]})
    rec = info(out["a"])
    assert rec.reason is Reason.DUET_TRIMMED and rec.marker_pos == 3 and rec.length == 3
    assert rec.weight == 1.0 and not sched.requests


# ---------------------------------------------------------------- ARRoL verdicts
def _verdict(pruned: bool, p: float = 0.4) -> ArrolVerdict:
    return ArrolVerdict(score=0.2, q=0.3, p=p, pruned=pruned, version=3, hidden=None,
                        trace=None)


def test_arrol_prune_ends_the_sample_in_its_step(sched):
    idle = free_blocks(sched)
    sched.add_request(request("a", rl_params(arrol={})))
    sched.add_request(request("plain"))
    step(sched)
    step(sched)
    out = step(sched, arrol={"a": _verdict(True), "plain": _verdict(True)})
    o, rec = out["a"], info(out["a"])
    assert o.finish_reason is FinishReason.ABORT
    assert rec.reason is Reason.ARROL_PRUNED and rec.weight == 0.0 and rec.length == 3
    assert rec.pruned is True and rec.p == 0.4 and rec.head_version == 3 and rec.floor is None
    assert "plain" not in out and "plain" in sched.requests     # no arrol flags: ignored
    out = step(sched, {"plain": [EOS]})
    assert out["plain"].stop_reason is None
    assert free_blocks(sched) == idle and sched.rl_stats["arrol_pruned"] == 1


def test_arrol_kept_verdict_is_recorded_at_the_end(sched):
    sched.add_request(request("a", rl_params(arrol={})))
    step(sched)
    step(sched, arrol={"a": _verdict(False, p=0.8)})
    out = step(sched, {"a": [EOS]})
    rec = info(out["a"])
    assert rec.reason is Reason.EOS and rec.pruned is False and rec.p == 0.8
    assert rec.weight == 1.0


def test_arrol_never_prunes_a_darts_group_below_m(sched):
    flags = darts_group("g", 2, 3, arrol={})
    for rid in "abc":
        sched.add_request(request(rid, flags))
    step(sched)
    # a's prune leaves b, c (2 = M); b's would then leave only c: overruled.
    out = step(sched, arrol={"a": _verdict(True), "b": _verdict(True)})
    assert info(out["a"]).reason is Reason.ARROL_PRUNED
    assert "b" not in out and sched.rl_members["b"].arrol.floor
    assert sched.rl_stats["arrol_floor"] == 1
    # c is scored at the floor: kept whatever its coin said, so no coin decided it
    step(sched, arrol={"c": _verdict(False)})
    assert sched.rl_members["c"].arrol.floor and sched.rl_stats["arrol_floor"] == 1
    out = step(sched, {"b": [EOS], "c": [EOS]})
    rec = info(out["b"])
    assert rec.reason is Reason.EOS and rec.floor is True and rec.pruned is False
    assert rec.weight == 1.0
    rec_c = info(out["c"])
    assert rec_c.reason is Reason.EOS and rec_c.floor is True and not sched.requests


# ---------------------------------------------------------------- weight sync
def test_weight_sync_preempts_and_records_versions(sched):
    idle = free_blocks(sched)
    sched.add_request(request("a", rl_params(group={"size": 1})))
    for _ in range(3):
        step(sched)
    sched.add_request(request("b", rl_params(group={"size": 1})))   # waiting, no token yet
    assert sched.rl_weight_version == 0
    assert sched.reset_prefix_cache() is True
    assert sched.rl_weight_version == 1
    a = sched.requests["a"]
    assert a.status is RequestStatus.PREEMPTED and a in sched.waiting
    assert a.num_output_tokens == 3 and a.num_computed_tokens == 0
    assert free_blocks(sched) == idle
    assert sched.rl_last_sync["weight_version"] == 1
    assert sched.rl_last_sync["requests_recomputed"] == 1
    assert sched.rl_last_sync["flagged_samples_across"] == 1
    so_before = sched.requests["a"].output_token_ids[:]
    out = step(sched)                                    # recomputes prompt + 3 tokens
    assert sched.requests["a"].output_token_ids[:3] == so_before
    assert n_out(sched, "a") == 4
    out = step(sched, {"a": [EOS], "b": [EOS]})
    ra, rb = info(out["a"]), info(out["b"])
    assert ra.weight_version == 0 and ra.weight_versions == [[0, 0], [1, 3]]
    assert rb.weight_version == 1 and rb.weight_versions is None


@pytest.mark.parametrize("kv_ok", [True, False])
def test_a_failed_reset_with_nothing_running_answers_as_vllm(sched, monkeypatch, kv_ok):
    """vLLM's contract (its ``test_aux_output_reset_follows_kv_reset_result``): with no
    request running, a reset whose KV cache manager fails returns False, raises nothing,
    and leaves the aux-output connector alone; the sync is still counted."""
    calls = []
    monkeypatch.setattr(sched.kv_cache_manager, "reset_prefix_cache", lambda: kv_ok)
    monkeypatch.setattr(sched, "aux_output_connector",
                        type("Aux", (), {"reset": lambda self: calls.append(1)})())
    assert sched.reset_prefix_cache() is kv_ok
    assert calls == ([1] if kv_ok else [])
    assert sched.rl_weight_version == 1 and sched.rl_last_sync["prefix_cache_reset"] is kv_ok


# ---------------------------------------------------------------- no flags
def test_request_without_flags_passes_through(sched):
    sched.add_request(request("plain"))
    sched.add_request(request("other", extra_args={"something_else": 1}))
    assert not sched.rl_members
    step(sched)
    out = step(sched, {"plain": [EOS], "other": [EOS]})
    for rid in ("plain", "other"):
        assert out[rid].finish_reason is FinishReason.STOP
        assert out[rid].stop_reason is None
    assert sched.rl_step == 2 and not sched.requests


def test_unread_flags_are_dropped_and_served_plain(sched):
    """Flags the front end did not vet: logged, dropped from the params, no record."""
    r = request("bad", extra_args={KEY: {"darts": {"mode": "bogus"}}, "keep": 1})
    sched.add_request(r)
    assert not sched.rl_members and r.sampling_params.extra_args == {"keep": 1}
    out = step(sched, {"bad": [EOS]})
    assert out["bad"].stop_reason is None
