"""The shared trainer side (vllm_rl.integrations.common): marks, advantages, diagnostics,
ARRoL feedback and the DARTS planner, on constructed records (no engine)."""
from __future__ import annotations

import math

import pytest
import torch

from vllm_rl.integrations.common.advantages import group_advantages, step_diagnostics
from vllm_rl.arrol.controller import ArrolFeedback, label_weight
from vllm_rl.arrol.measures import weighted_auc
from vllm_rl.integrations.common.marks import training_marks
from vllm_rl.darts.controller import DartsPlanner
from vllm_rl.outcome import Reason, RolloutInfo

R = Reason


def _info(reason, length, **kw):
    return RolloutInfo(reason=reason, length=length, **kw)


def test_duet_alone_aborted_samples_stay_in_the_baseline_out_of_the_loss():
    """Alg. A.10 l.38-40: the group baseline runs over every rollout, aborted ones with
    their own reward; an aborted rollout's advantage is 0; an eps-kept one weighs 1/eps."""
    flags = {"duet": {"eps": 0.25}}
    infos = [_info(R.EOS, 30, keep_prob=1.0), _info(R.DUET_TRIMMED, 40, keep_prob=1.0),
             _info(R.DUET_ABORTED, 120, weight=0.0, keep_prob=0.25),
             _info(R.EOS, 200, weight=4.0, keep_prob=0.25)]
    marks = training_marks(infos, [flags] * 4)
    assert [m.keep for m in marks] == [True, True, False, True]
    assert all(m.baseline for m in marks)
    assert [m.weight for m in marks] == [1.0, 1.0, 0.0, 4.0]
    assert [m.eps_kept for m in marks] == [False, False, False, True]
    rewards = [1.0, 1.0, 0.0, 0.0]
    adv = group_advantages(rewards, marks, ["g"] * 4)
    mean, std = 0.5, math.sqrt(1 / 3)
    assert adv[0] == pytest.approx((1 - mean) / (std + 1e-4))
    assert adv[2] == 0.0
    assert adv[3] == pytest.approx(4.0 * (0 - mean) / (std + 1e-4))


def test_darts_group_baseline_is_the_selected_m():
    """Dual-end K = 1, L = 1 of M = 2 from 4: the shortest and the longest valid are the
    training group and its baseline; an aborted one (the gate, inside DARTS) and a
    length-capped one are neither."""
    flags = {"group": {"size": 2, "redundant": 4}, "darts": {"mode": "dual_end", "k": 1}}
    infos = [_info(R.EOS, 30, group_id="g", finish_rank=1),
             _info(R.EOS, 60, group_id="g", finish_rank=2),
             _info(R.DUET_ABORTED, 90, group_id="g", weight=0.0, finish_rank=3),
             _info(R.LENGTH, 128, group_id="g", finish_rank=4)]
    marks = training_marks(infos, [flags] * 4)
    assert [m.keep for m in marks] == [True, True, False, False]
    assert [m.baseline for m in marks] == [True, True, False, False]
    assert [m.info.selection for m in marks] == ["short", "long", None, None]


@pytest.mark.parametrize("reason", [R.ARROL_PRUNED, R.ABORT])
def test_a_sample_past_duets_gate_then_ended_otherwise_is_not_eps_kept(reason):
    """Kept by DUET's coin at the gate (keep_prob = eps, weight 1/eps), then pruned by
    ARRoL's coin or aborted by the client: not DUET's tail.  Inside a DARTS group it is
    neither selected nor in the baseline, and its weight is 0 (ARCHITECTURE's table)."""
    eps = 0.05
    flags = {"group": {"size": 2, "redundant": 4}, "darts": {"mode": "dual_end", "k": 1},
             "duet": {"eps": eps}, "arrol": {}}
    ended = _info(reason, 120, group_id="g", weight=0.0 if reason is R.ARROL_PRUNED
                  else 1 / eps, keep_prob=eps, finish_rank=3)
    assert not ended.eps_kept
    infos = [_info(R.EOS, 30, group_id="g", finish_rank=1, keep_prob=1.0),
             _info(R.EOS, 60, group_id="g", finish_rank=2, keep_prob=1.0), ended,
             _info(R.EOS, 200, group_id="g", weight=1 / eps, keep_prob=eps, finish_rank=4)]
    marks = training_marks(infos, [flags] * 4)
    assert [(m.keep, m.baseline, m.eps_kept) for m in marks] == [
        (True, True, False), (True, True, False), (False, False, False), (True, True, True)]
    assert marks[2].weight == 0.0 and marks[2].info.selected is False
    assert marks[3].info.selection == "eps_kept" and marks[3].weight == 1 / eps


def test_arrol_pruned_and_client_aborted_leave_everything():
    flags = {"arrol": {}}
    infos = [_info(R.EOS, 40, score=0.3), _info(R.ARROL_PRUNED, 24, weight=0.0, pruned=True),
             _info(R.ABORT, 10), None]
    marks = training_marks(infos, [flags, flags, flags, None])
    assert [(m.keep, m.baseline) for m in marks] == [(True, True), (False, False),
                                                     (False, False), (True, True)]


def test_group_advantages_need_two_baseline_members():
    flags = {"arrol": {}}
    infos = [_info(R.EOS, 40), _info(R.ARROL_PRUNED, 24, weight=0.0)]
    marks = training_marks(infos, [flags] * 2)
    assert group_advantages([1.0, 0.0], marks, ["g", "g"]) == [0.0, 0.0]
    with pytest.raises(ValueError, match="scale"):
        group_advantages([1.0], marks[:1], ["g"], scale="batch")


def test_step_diagnostics():
    flags = {"duet": {"eps": 0.25}}
    infos = [_info(R.EOS, 30, keep_prob=1.0), _info(R.EOS, 30, keep_prob=1.0),
             _info(R.EOS, 200, weight=4.0, keep_prob=0.25),
             _info(R.EOS, 30), _info(R.EOS, 30)]
    marks = training_marks(infos, [flags] * 3 + [None] * 2)
    groups = ["a", "a", "a", "b", "b"]
    adv = group_advantages([1.0, 1.0, 0.0, 1.0, 1.0], marks, groups)
    d = step_diagnostics(marks, adv, groups)
    assert d["groups"] == 2 and d["loss_samples"] == 5 and d["loss_samples_min"] == 2
    assert d["zero_adv_groups"] == 0.5                       # group b: all rewards equal
    a = [abs(x) for x in adv]
    assert d["ess"] == pytest.approx(sum(a) ** 2 / sum(x * x for x in a))
    assert d["eps_weight_share"] == pytest.approx(a[2] / sum(a))
    assert 0 < d["ess_fraction"] < 1


def test_label_weights_are_inverse_propensities():
    assert label_weight(_info(R.EOS, 40, p=0.5), 20) == 2.0
    assert label_weight(_info(R.EOS, 40, p=0.5, floor=True), 20) == 1.0
    assert label_weight(_info(R.EOS, 40, keep_prob=0.05), 20) == 20.0
    assert label_weight(_info(R.EOS, 40, keep_prob=0.05, p=0.5), 20) == 20.0   # capped


def test_weighted_auc_matches_the_pairwise_definition():
    g = torch.Generator().manual_seed(0)
    s = torch.rand(40, generator=g).round(decimals=1).tolist()         # ties included
    y = (torch.rand(40, generator=g) < 0.5).int().tolist()
    w = (torch.rand(40, generator=g) + 0.5).tolist()
    num = den = 0.0
    for i in range(40):
        for j in range(40):
            if y[i] == 1 and y[j] == 0:
                pair = w[i] * w[j]
                den += pair
                num += pair * (1.0 if s[i] > s[j] else 0.5 if s[i] == s[j] else 0.0)
    assert weighted_auc(s, y, w) == pytest.approx(num / den)
    assert weighted_auc([0.1, 0.2], [1, 1], [1, 1]) == 0.5


def _scored(reason, trace, label_positive, version=1, **kw):
    return _info(reason, 40, score=float(trace[0] > 0) * 0.8 + 0.1, head_version=version,
                 trace=list(trace), **kw), (1.0 if label_positive else 0.0)


def test_feedback_labels_what_each_sample_earned_and_gates_on_heldout_auc():
    """Samples a coin removed (pruned, aborted) never become labels; a DARTS-cancelled one
    is labelled by the reward it earned; the gate opens only after the cold start and
    once the engine's own (held-out) scores rank >= auc_gate within groups; the
    calibration holds only those out-of-sample scores."""
    fb = ArrolFeedback({"l_detect": 8}, inputs="trace", hidden_size=8, cold_start_steps=2,
                       gate_min=16, epochs=5, gate="cold", auc_gate=0.65)
    g = torch.Generator().manual_seed(1)
    opened = []
    for step in range(4):
        infos, rewards, groups = [], [], []
        for k in range(24):
            x = float(torch.randn(1, generator=g))
            info, r = _scored(R.EOS, (x, x - 1, 1.0), x > 0, version=step)
            infos.append(info)
            rewards.append(r)
            groups.append(k // 8)
        for reason in (R.ARROL_PRUNED, R.DARTS_CANCELLED, R.DUET_ABORTED):
            info, r = _scored(reason, (-5.0, -6.0, 1.0), False, version=step)
            infos.append(info)
            rewards.append(r)
            groups.append(0)
        update = fb.observe(infos, rewards, groups)
        assert update["head"]["features"] and update["version"] == step + 1
        opened.append(not update["cold_start"])
        assert fb.metrics["arrol/labels"] == 25                  # 24 ends and the cancelled
    assert len(fb.buffer) == 100
    # steps 1-2 run cold (the update after step 1 keeps step 2 cold), the update after
    # step 2 lets step 3 prune: the head version 1's scores of step 2 rank well
    assert opened == [False, True, True, True]
    assert fb.metrics["arrol/heldout_auc"] > 0.9
    assert fb.metrics["arrol/calibration_samples"] == 75         # head versions 1-3 only


def test_balance_gain_is_positive_only_where_steering_helps():
    """balance_gain: Eq. 2 prunes the likelier-correct harder, so with a head that ranks
    perfectly, mostly-correct groups come closer to rho (gain > 0), groups that straddle
    rho go farther (gain < 0), and keeping every sample (p = 1) changes nothing."""
    from vllm_rl.arrol.measures import balance_gain

    def groups(share, n=16, count=20):
        y = [1] * round(share * n) + [0] * (n - round(share * n))
        return y * count, [k for k in range(count) for _ in range(n)]

    y, g = groups(0.875)
    p = [0.2 if v else 0.8 for v in y]                    # a perfect head, E[p] = kappa
    easy = balance_gain(p, y, [1.0] * len(y), g, 0.5, seed=1)
    assert easy["gain"] > 0.1 and easy["groups"] == 20
    assert abs(easy["stock"] - 0.375) < 1e-12
    y, g = groups(0.5)
    p = [0.2 if v else 0.8 for v in y]
    assert balance_gain(p, y, [1.0] * len(y), g, 0.5, seed=1)["gain"] < -0.1
    assert balance_gain([1.0] * len(y), y, [1.0] * len(y), g, 0.5)["gain"] == 0.0
    # weights: a survivor stands for 1/p samples of its group
    w = balance_gain([1.0] * 4, [1, 0, 0, 0], [3.0, 1.0, 1.0, 1.0], [0] * 4, 0.5)
    assert w["stock"] == 0.0
    assert balance_gain([0.5], [1], [1.0], [0], 0.5) is None     # no group of two
    with pytest.raises(ValueError, match="length"):
        balance_gain([0.5, 0.5], [1], [1.0], [0], 0.5)


@pytest.mark.parametrize("gate", ["balance", "steering"])
def test_feedback_gate_opens_only_where_steering_brings_groups_closer_to_rho(gate):
    """The gate's test on held-out scores from a head that ranks perfectly: mostly-correct
    groups (7 of 8) open it, groups at 4 of 8 (where Eq. 2 with E[p] = kappa prunes the
    likelier-correct harder, and random pruning keeps the share at rho in expectation)
    keep it shut, under the balance test and under the steering test against random
    pruning at the same keep rate; the metrics carry the test's figures."""
    def run(correct):
        fb = ArrolFeedback({"l_detect": 8}, inputs="trace", hidden_size=8, gate=gate,
                           cold_start_steps=0, gate_min=16, epochs=2)
        opened = []
        for step in range(3):
            infos, rewards, groups = [], [], []
            for k in range(32):
                y = (k % 8) < correct
                x = 1.0 + 0.01 * k if y else -1.0 - 0.01 * k
                info, r = _scored(R.EOS, (x, x, x), y, version=step + 1)
                infos.append(info)
                rewards.append(r)
                groups.append(k // 8)
            update = fb.observe(infos, rewards, groups)
            opened.append(not update["cold_start"])
        return opened, fb.metrics

    opened, metrics = run(7)
    assert opened[-1] and metrics[f"arrol/{gate}_gain"] > 0
    assert metrics["arrol/heldout_auc"] > 0.9
    opened, metrics = run(4)
    assert not any(opened) and metrics[f"arrol/{gate}_gain"] < 0
    assert metrics["arrol/gate_open"] == 0.0 and metrics["arrol/heldout_auc"] > 0.9


def test_steering_gain_compares_with_random_pruning_at_the_same_keep_rate():
    """steering_gain: random pruning at p̄ is the reference (Table 4), so a head with
    p = p̄ everywhere gains exactly 0; a group of 4 of 8 is one that random pruning
    already keeps at rho in expectation, and halving a group of 8 at random moves it away
    from rho, which the balance test counts against any pruning and this one does not."""
    from vllm_rl.arrol.measures import balance_gain, steering_gain

    y = ([1] * 7 + [0]) * 20
    g = [k for k in range(20) for _ in range(8)]
    w = [1.0] * len(y)
    flat = steering_gain([0.5] * len(y), y, w, g, 0.5, seed=3)
    assert flat["gain"] == 0.0 and flat["keep_rate"] == 0.5 and flat["random"] > 0
    assert balance_gain([0.5] * len(y), y, w, g, 0.5, seed=3)["gain"] < 0   # random fails
    steer = steering_gain([0.3 if v else 0.9 for v in y], y, w, g, 0.5, seed=3)
    assert steer["gain"] > 2 * steer["se"] > 0
    assert steer["keep_rate"] == pytest.approx((7 * 0.3 + 0.9) / 8)
    assert steering_gain([0.5], [1], [1.0], [0], 0.5) is None


def test_within_group_auc_ignores_ranking_across_prompts():
    """A score that only tells an easy prompt from a hard one ranks perfectly across
    prompts and not at all within them: the gate's AUC sees the latter."""
    from vllm_rl.arrol.measures import grouped_auc

    scores = [0.9, 0.9, 0.9, 0.9, 0.1, 0.1, 0.1, 0.1]          # prompt a, then prompt b
    labels = [1, 1, 1, 0, 0, 0, 0, 1]
    groups = ["a"] * 4 + ["b"] * 4
    assert weighted_auc(scores, labels, [1] * 8) > 0.7
    assert grouped_auc(scores, labels, [1] * 8, groups) == 0.5
    assert grouped_auc([0.2, 0.8, 0.3, 0.7], [0, 1, 0, 1], [1, 1, 1, 3], "aabb") == 1.0
    assert grouped_auc([0.2, 0.8], [1, 1], [1, 1], "aa") is None


def test_feedback_gate_stays_shut_for_a_head_that_cannot_rank():
    fb = ArrolFeedback({"l_detect": 8}, inputs="trace", hidden_size=8, cold_start_steps=0,
                       gate_min=16, epochs=2)
    g = torch.Generator().manual_seed(2)
    for step in range(3):
        infos, rewards = [], []
        for _ in range(32):
            x = float(torch.randn(1, generator=g))
            info, _ = _scored(R.EOS, (x, x, x), True, version=step + 1)
            infos.append(info)
            rewards.append(float(torch.rand(1, generator=g) < 0.5))  # labels unrelated
        update = fb.observe(infos, rewards)
        assert update["cold_start"] and update["calibration"] is None
    assert fb.metrics["arrol/gate_open"] == 0.0


def test_feedback_reads_hidden_states_taken_from_the_worker():
    """A hidden-state head learns from records holding their vector (taken with
    arrol_hidden); a record that only names one (hidden_id, never taken) is left out and
    counted, never trained on as zeros."""
    g = torch.Generator().manual_seed(3)
    fb = ArrolFeedback({"l_detect": 8}, inputs="both", cold_start_steps=1, epochs=2)
    infos, rewards = [], []
    for k in range(12):
        info, r = _scored(R.EOS, (0.1 * k, -1.0, 1.0), k % 2 == 0, hidden_id=f"r{k}")
        if k < 8:
            info = info.with_hidden(torch.randn(6, generator=g).numpy())
        infos.append(info)
        rewards.append(r)
    update = fb.observe(infos, rewards)
    assert update is not None and len(update["head"]["w1"][0]) == 6
    assert fb.metrics["arrol/labels"] == 8 and fb.metrics["arrol/hidden_missing"] == 4


def test_planner_saturates_only_the_high_variance_prompts():
    """Alg. 1 over [M, 2M] for 1.5 MN; Alg. 2: shortest-only only at M'_i = 2M."""
    p = DartsPlanner(M=4, budget=1.5)
    first = p.plan(["a", "b", "c", "d"])
    assert [x.n for x in first] == [6, 6, 6, 6]                  # no history: uniform
    assert all(x.mode == "dual_end" and x.k == 3 for x in first)
    p.observe({"a": [10, 11, 10, 12], "b": [10, 200, 15, 180], "c": [20, 30, 25, 22],
               "d": [10, 10, 10, 10]})
    plans = {x.prompt_id: x for x in p.plan(["a", "b", "c", "d"])}
    assert sum(x.n for x in plans.values()) == 24
    assert plans["b"].n == 8 and plans["b"].mode == "shortest"
    assert plans["d"].n == 4 and plans["d"].mode == "dual_end"
    assert all(x.mode == "dual_end" for k, x in plans.items() if x.n < 8)
    with pytest.raises(ValueError, match="budget"):
        DartsPlanner(M=4, budget=2.5)
