"""Partial rollouts without an engine: the flags, the step book, the carry buffer and the
records a trainer gets (``vllm_rl.integrations.common.partial``)."""
from __future__ import annotations

import json

import pytest

from vllm_rl.engine.groups import GroupRegistry, Member
from vllm_rl.engine.steps import StepBook, stale
from vllm_rl.end_step import end_step
from vllm_rl.flags import FlagError, read, read_step, rl_params
from vllm_rl.integrations.common.marks import training_marks
from vllm_rl.integrations.common.partial import (CHECKPOINT_FILE, CarriedGroup,
                                                 CarryBuffer, Part, PartialConfig,
                                                 continuation, merge, staleness,
                                                 tis_weights)
from vllm_rl.outcome import Reason, RolloutInfo, token_spans


def _flags(**partial):
    return read({"vllm_rl": {"group": {"id": "g", "size": 2, "redundant": 4},
                             "partial": partial}})


def test_continuation_flags_read_back_and_drop_arrol():
    raw = {"arrol": {}, "partial": {"step": 3, "start_step": 1, "prior_tokens": 9,
                                    "prior_versions": [[0, 0], [1, 4]],
                                    "group_ended": [[5, True], [7, False]], "seed": 11}}
    f = read({"vllm_rl": raw})
    assert f.arrol is None, "a continuation is never scored again"
    assert f.partial.prior_versions == ((0, 0), (1, 4))
    assert read({"vllm_rl": f.canonical()}) == f
    assert read({"vllm_rl": json.dumps(f.canonical())}) == f


@pytest.mark.parametrize("partial, flag", [
    ({"step": 1, "prior_tokens": 4}, "partial.start_step"),
    ({"step": 1, "start_step": 0, "prior_tokens": 4, "prior_versions": [[0, 1]]},
     "partial.prior_versions"),
    ({"step": 1, "start_step": 0, "prior_tokens": 4, "prior_versions": [[0, 0], [1, 4]]},
     "partial.prior_versions"),
    ({"step": 1, "group_ended": [[3, "yes"]]}, "partial.group_ended"),
    ({"step": -1}, "partial.step"),
    ({"until_groups": 0}, "partial.until_groups"),
])
def test_bad_partial_flags_name_the_flag(partial, flag):
    with pytest.raises(FlagError) as e:
        rl_params(partial=partial)
    assert e.value.flag == flag


def test_step_book_ends_a_step_by_its_rule():
    book = StepBook()
    members = [Member(f"r{i}", _flags(step=0, until_groups=2)) for i in range(3)]
    for m in members:
        book.join(m)
    assert book.due({}) == []
    book.leave(members[0], 10, 1)
    assert book.due({}) == []
    book.leave(members[1], 10, 1)
    (state,) = book.due({})
    assert state.ended and list(state.live) == ["r2"]
    late = Member("r3", _flags(step=0, until_groups=2))
    book.join(late)
    (state,) = book.due({})
    assert list(state.live) == ["r2", "r3"], "a late arrival to an ended step is carried"
    book.leave(members[2], 3, 0)
    book.leave(late, 0, 0)
    assert not book, "a step with no sample left is forgotten"


def test_token_and_time_rules_wait_for_a_complete_group():
    book = StepBook()
    m = Member("r", _flags(step=0, until_s=0.0, until_tokens=1))
    book.join(m)
    assert book.due({}) == [], "a step never ends with nothing to train on"


def test_staleness_cap():
    assert not stale(Member("r", _flags(step=3, start_step=3, max_staleness=1)))
    assert stale(Member("r", _flags(step=4, start_step=3, max_staleness=1)))
    assert stale(Member("r", _flags(step=3, max_staleness=0)))
    assert not stale(Member("r", _flags(step=9, start_step=0)))


def test_a_continued_group_counts_its_earlier_members():
    registry = GroupRegistry()
    m = Member("c", read({"vllm_rl": {
        "group": {"id": "g", "size": 2, "redundant": 4},
        "partial": {"step": 2, "start_step": 1, "prior_tokens": 5,
                    "group_ended": [[7, True], [9, False], [4, True]]}}}))
    state = registry.join(m)
    assert (state.arrived, state.left, state.ended, state.valid) == (4, 3, 3, 2)
    assert state.finished == [(7, 1), (4, 3)]
    assert m.length(6) == 11


def _info(reason, length, **kw):
    return RolloutInfo(reason=reason, length=length, group_id="g", **kw)


def test_merge_joins_tokens_logprobs_and_counts():
    prior = Part([1, 2, 3], [-0.1, -0.2, -0.3],
                 _info(Reason.CARRIED, 3, draft_proposed=4, draft_accepted=2, score=0.7,
                       p=0.5, start_step=0, step=0, weight=0.0), seed=5, text="ab")
    info = _info(Reason.EOS, 5, draft_proposed=2, draft_accepted=1, start_step=0, step=1,
                 steps_crossed=1, prior_tokens=3, weight_versions=[[0, 0], [1, 3]])
    whole = merge(prior, [4, 5], [-0.4, -0.5], info, text="cd")
    assert whole.token_ids == [1, 2, 3, 4, 5] and whole.logprobs[-1] == -0.5
    assert whole.info.length == len(whole.token_ids) and whole.text == "abcd"
    assert (whole.info.draft_proposed, whole.info.draft_accepted) == (6, 3)
    assert (whole.info.score, whole.info.p) == (0.7, 0.5), "ARRoL's verdict is the scored part's"
    assert whole.seed == 5


def test_continuation_request_covers_the_whole_sample():
    g = CarriedGroup("q", [7, 8], {"group": {"size": 2}, "duet": {"eps": 0.05},
                                  "arrol": {}}, "g", 2, 4, start_step=1)
    g.ended = [Part([1] * 6, [0.0] * 6, _info(Reason.EOS, 6)),
               Part([1] * 9, [0.0] * 9, _info(Reason.DUET_ABORTED, 9, keep_prob=1.0))]
    part = Part([3, 4, 5], [0.0] * 3,
                _info(Reason.CARRIED, 3, k1=8, k2=20, start_step=1, weight_version=2),
                seed=40)
    ids, flags, left, seed = continuation(g, part, 2, {"step": 2, "until_groups": 3}, 16)
    assert ids == [7, 8, 3, 4, 5] and left == 13 and seed != 40
    assert "arrol" not in flags and flags["duet"]["k1"] == 8 and flags["duet"]["k2"] == 20
    p = read({"vllm_rl": flags}).partial
    assert (p.step, p.start_step, p.prior_tokens, p.seed) == (2, 1, 3, 40)
    assert p.prior_versions == ((2, 0),)
    assert p.group_ended == ((6, True), (9, False))


@pytest.mark.parametrize("gate_open, regime_gate", [(True, False), (False, True),
                                                     (None, True)])
def test_a_continuation_keeps_the_gate_its_part_ran_with(gate_open, regime_gate):
    """A part whose gate was open met (or would meet) its coin at eps: its continuation
    keeps the paper's gate, so the same coin meets the same eps (survival eps, weight
    1/eps).  Where the regime gate had it shut (eps = 1) any later eps is still exact."""
    g = CarriedGroup("q", [7], {"duet": {"eps": 0.05, "regime_gate": True}}, "g", 1, 1,
                     start_step=0)
    part = Part([3], [0.0], _info(Reason.CARRIED, 1, k1=8, k2=20, gate_open=gate_open),
                seed=40)
    _, flags, _, _ = continuation(g, part, 1, {"step": 1}, 16)
    assert flags["duet"]["regime_gate"] is regime_gate and flags["duet"]["eps"] == 0.05


def test_buffer_drops_past_the_cap_and_gone_prompts_with_a_record():
    buf = CarryBuffer()
    for name, start in (("a", 0), ("b", 2), ("c", 2)):
        g = CarriedGroup(name, [1], {}, name, 1, 2, start_step=start)
        g.carried = [Part([5], [0.0], _info(Reason.CARRIED, 1, start_step=start))]
        buf.groups.append(g)
    state = json.loads(json.dumps(buf.state_dict()))   # a checkpoint is plain JSON
    go, done = buf.take(3, max_staleness=1, keep=lambda g: g.prompt != "c")
    assert [g.prompt for g in go] == ["b"]
    assert buf.state_dict() == state, "the buffer changes only when the step commits"
    buf.commit([])
    assert len(buf) == 0
    assert sorted(g.prompt for g in done) == ["a", "c"]
    for g in done:
        (part,) = g.ended
        assert part.info.reason is Reason.STALE and part.info.weight == 0.0
        assert part.info.step == 3
    restored = CarryBuffer()
    restored.load_state_dict(state)
    assert restored.samples() == 3
    dropped = restored.drop_all(4)
    assert len(restored) == 0
    assert all(p.info.reason is Reason.STALE for g in dropped for p in g.ended)


def test_stale_and_carried_samples_leave_the_loss_and_the_baseline():
    infos = [_info(Reason.EOS, 4), _info(Reason.STALE, 9, weight=0.0),
             _info(Reason.CARRIED, 3, weight=0.0)]
    marks = training_marks(infos, [{"group": {"id": "g", "size": 3}}] * 3)
    assert [(m.keep, m.baseline) for m in marks] == [(True, True), (False, False),
                                                    (False, False)]


def test_rule_and_diagnostics():
    cfg = PartialConfig()
    assert cfg.rule(5, groups=7, samples=56, max_tokens=100) == {"step": 5, "until_groups": 4}
    rule = PartialConfig(over=1.0, token_share=0.5, time_s=2.0, max_staleness=1).rule(
        0, 4, 32, 100)
    assert rule == {"step": 0, "until_groups": 4, "until_tokens": 1600, "until_s": 2.0,
                    "max_staleness": 1}
    # spread over engines, the drop-in ends the step: the flags keep the step and the cap
    assert PartialConfig(time_s=2.0, max_staleness=1).rule(3, 4, 32, 100, by_engine=False) \
        == {"step": 3, "max_staleness": 1}
    with pytest.raises(ValueError, match="token_share"):
        PartialConfig(token_share=0.5).rule(3, 4, 32, 100, by_engine=False)
    with pytest.raises(ValueError):
        PartialConfig(over=0.5)
    parts = [Part([0] * 10, [0.0] * 10, _info(Reason.EOS, 10, steps_crossed=1,
                                               weight_version=1,
                                               weight_versions=[[1, 0], [2, 4]])),
             Part([0] * 10, [0.0] * 10, _info(Reason.EOS, 10, steps_crossed=0,
                                               weight_version=2))]
    d = staleness(parts)
    assert d["carried_share"] == 0.5 and d["staleness_max"] == 1.0
    assert d["stale_token_share"] == pytest.approx(4 / 20)
    assert d["stale_sample_share"] == 0.5 and d["token_age_max"] == 1.0
    assert tis_weights([-1.0, -1.0], [-1.0, -3.0], 2.0) == [1.0, 2.0]


def test_staleness_counts_every_token_older_than_the_steps_weights():
    """The issue's case: 7 members ended in step s (weights 1) and train in step s + 1
    (weights 2) beside their carried sibling; every one of their tokens is a step old."""
    members = [Part([0] * 12, [0.0] * 12, _info(Reason.EOS, 12, weight_version=1))
               for _ in range(7)]
    carried = Part([0] * 16, [0.0] * 16, _info(Reason.EOS, 16, steps_crossed=1,
                                               weight_version=1,
                                               weight_versions=[[1, 0], [2, 10]]))
    d = staleness(members + [carried], version=2)
    assert d["carried_share"] == 1 / 8
    assert d["stale_sample_share"] == 1.0                   # all 8 hold older tokens
    assert d["stale_token_share"] == pytest.approx((7 * 12 + 10) / (7 * 12 + 16))
    assert d["token_age_share_0"] == pytest.approx(6 / 100)
    assert d["token_age_share_1"] == pytest.approx(94 / 100)
    assert d["token_age_mean"] == pytest.approx(0.94)
    assert staleness(members + [carried]) == d              # the newest span's version
    old = staleness(members, version=4)                     # three steps later
    assert old["token_age_share_3plus"] == 1.0 and old["token_age_max"] == 3.0
    with pytest.raises(ValueError, match="newer"):
        staleness([carried], version=1)


@pytest.mark.parametrize("spans, length, cut", [
    ([[0, 0]], 5, [[0, 0]]),
    ([[0, 0], [1, 5]], 5, [[0, 0]]),                 # a sync after the last token
    ([[0, 0], [1, 5]], 7, [[0, 0], [1, 5]]),
    ([[0, 0], [1, 3], [2, 3]], 7, [[0, 0], [2, 3]]),  # two syncs with no token between
    ([[0, 0], [1, 3], [2, 3]], 3, [[0, 0]]),
    ([[0, 0], [1, 0]], 4, [[1, 0]]),                 # version 0 made no token
    ([[0, 0], [0, 5]], 9, [[0, 0]]),                 # the same weights on both sides
    ([[0, 0], [1, 2], [1, 5], [2, 9]], 9, [[0, 0], [1, 2]]),
    ([[3, 0]], 0, [[3, 0]]),                          # no token: the first span stays
])
def test_spans_keep_only_those_holding_a_token(spans, length, cut):
    assert token_spans(spans, length) == cut
    if length:                       # what a continuation of ``length`` tokens takes back
        read({"vllm_rl": {"partial": {"step": 1, "start_step": 0, "prior_tokens": length,
                                      "prior_versions": cut}}})


def test_a_record_with_an_empty_span_goes_back_as_a_valid_continuation():
    """A record an older engine wrote with a span after its last token (a continuation
    queued when its step ended, after a sync) is cut before it is sent again."""
    g = CarriedGroup("q", [7, 8], {"group": {"size": 2}}, "g", 2, 2, start_step=0)
    part = Part([1] * 5, [0.0] * 5, _info(Reason.CARRIED, 5, start_step=0, weight_version=0,
                                          weight_versions=[[0, 0], [1, 5]]))
    _, flags, _, _ = continuation(g, part, 1, {"step": 1}, 16)
    assert read({"vllm_rl": flags}).partial.prior_versions == ((0, 0),)


@pytest.mark.parametrize("step", [1.5, True, False, "1", None, -1, 2.0])
def test_a_step_is_read_as_the_flags_read_it(step):
    with pytest.raises(FlagError) as e:
        read_step(step)
    assert e.value.flag == "partial.step"
    with pytest.raises(FlagError):
        end_step(object(), step)           # refused before any engine is reached


def test_a_good_step_reads_back():
    assert read_step(0) == 0 and read_step(12) == 12


def _buffer(*names: str) -> CarryBuffer:
    buf = CarryBuffer()
    for name in names:
        g = CarriedGroup(name, [1, 2], {"group": {"id": name, "size": 2}}, name, 2, 2,
                         start_step=0)
        g.ended = [Part([4], [-0.5], _info(Reason.EOS, 1, start_step=0))]
        g.carried = [Part([5, 6], [-0.1, -0.2], _info(Reason.CARRIED, 2, start_step=0,
                                                       weight_version=0), seed=3)]
        buf.groups.append(g)
    return buf


class _Completion:
    """What vLLM's ``CompletionOutput`` gives ``part_of``."""

    def __init__(self, ids, info, index=0):
        self.token_ids, self.logprobs, self.rollout_info = ids, None, info
        self.index, self.text = index, None


class _Output:
    def __init__(self, prompt_ids, completions):
        self.prompt_token_ids, self.outputs = prompt_ids, completions


def test_launch_is_all_or_nothing():
    """A launch that cannot be built raises naming the cause, and the buffer, its groups
    and their samples are as they were; a step that fails after the launch (its
    generate) leaves them too, and the next launch takes them all again."""
    from vllm import SamplingParams

    buf = _buffer("a", "b")
    before = json.loads(json.dumps(buf.state_dict()))
    cfg = PartialConfig(over=2.0)
    good = SamplingParams(n=2, max_tokens=8, extra_args=rl_params(group={"size": 2}))
    bad = SamplingParams(n=2, max_tokens=8, extra_args={"vllm_rl": '{"group": {}}'})
    with pytest.raises(ValueError, match="prompt 1's extra_args"):
        buf.launch(cfg, 1, ["p", "q"], [good, bad], 8, 1.0)
    with pytest.raises(ValueError, match="2 prompts, 1 SamplingParams"):
        buf.launch(cfg, 1, ["p", "q"], [good], 8, 1.0)
    assert buf.state_dict() == before
    launched = buf.launch(cfg, 1, ["p"], [good], 8, 1.0)       # then generate fails
    assert len(launched.prompts) == 3 and buf.state_dict() == before
    assert "partial" not in good.extra_args["vllm_rl"], "the caller's params are its own"
    again = buf.launch(cfg, 2, ["p"], [good], 8, 1.0)
    assert [h[0].prompt for h in again.handles[:2]] == ["a", "b"]
    with pytest.raises(ValueError, match="2 outputs for 3 requests"):
        buf.finish(again, [None, None])
    assert buf.state_dict() == before


def test_a_prompt_without_flags_runs_with_the_steps_rule():
    from vllm import SamplingParams

    buf = CarryBuffer()
    plain = SamplingParams(n=2, max_tokens=8)
    launched = buf.launch(PartialConfig(), 4, ["p"], [plain], 8, 1.0)
    (sp,) = launched.params
    assert read(sp.extra_args).partial.step == 4 and plain.extra_args is None


def test_finish_commits_the_step_once_its_results_are_in():
    """Carried again, complete, and a group the step's new prompt carried: the buffer
    holds exactly the groups with a carried sample, each sample once."""
    from vllm import SamplingParams

    buf = _buffer("a", "b")
    sp = SamplingParams(n=2, max_tokens=8, extra_args=rl_params(group={"size": 2}))
    launched = buf.launch(PartialConfig(over=2.0), 1, [{"prompt_token_ids": [9]}], [sp], 8, 1.0)
    whole = _info(Reason.EOS, 4, start_step=0, step=1, prior_tokens=2)
    again = _info(Reason.CARRIED, 3, start_step=0, step=1, prior_tokens=2)
    new = [_Completion([3], RolloutInfo(Reason.EOS, 1, group_id="n", step=1)),
           _Completion([3, 4], RolloutInfo(Reason.CARRIED, 2, group_id="n", step=1), 1)]
    outs = [_Output([1, 2, 5, 6], [_Completion([7, 8], whole)]),
            _Output([1, 2, 5, 6], [_Completion([7], again)]),
            _Output([9], new)]
    complete = buf.finish(launched, outs)
    assert [g.prompt for g in complete] == ["a"]
    assert [p.token_ids for p in complete[0].ended] == [[4], [5, 6, 7, 8]]
    assert [g.prompt for g in buf.groups] == ["b", {"prompt_token_ids": [9]}]
    assert [p.token_ids for p in buf.groups[0].carried] == [[5, 6, 7]]
    assert buf.samples() == 2


def test_the_buffer_rides_in_a_checkpoint_folder(tmp_path):
    buf = _buffer("a")
    assert not CarryBuffer().load(str(tmp_path / "none"))
    path = buf.save(str(tmp_path / "checkpoint-3"))
    assert path.endswith(CHECKPOINT_FILE)
    back = CarryBuffer()
    assert back.load(str(tmp_path / "checkpoint-3"))
    assert back.state_dict() == buf.state_dict()
