"""The exact early-stop rule and the client-side selection, as pure functions."""
import itertools
import random

from vllm_rl import Reason, RolloutInfo
from vllm_rl.darts.rule import selection_final, shortest_selection
from vllm_rl.darts.rule import annotate_group


def test_waits_for_every_live_sibling_to_reach_the_mth_length():
    finished = [(10, 1), (12, 2)]
    assert not selection_final(finished, 2, [11, 30])          # one sibling may end at 12
    assert selection_final(finished, 2, [12, 30])              # it can only end longer
    assert not selection_final(finished, 3, [50])              # fewer than M ended
    assert not selection_final(finished, 2, [40], missing=1)   # a sibling never started
    assert not selection_final(finished, 2, [0, 40])           # one waits for its prefill
    assert selection_final([(7, 3), (5, 1), (9, 2)], 2, [7])   # M-th shortest is 7


def test_rule_never_stops_before_the_m_shortest_are_known():
    """Simulate groups whose members start and advance at random speeds: whenever the
    rule fires, no live or later-finishing sibling can beat a selected sample."""
    rng = random.Random(0)
    for trial in range(300):
        m, n = rng.randint(1, 5), rng.randint(5, 10)
        final = [rng.randint(1, 40) for _ in range(n)]
        valid = [rng.random() < 0.8 for _ in range(n)]
        start = [rng.randint(0, 10) for _ in range(n)]
        speed = [rng.choice((1, 1, 2, 3)) for _ in range(n)]
        tokens, rank, finished, ended = [0] * n, 0, [], set()
        for step in itertools.count():
            for i in range(n):
                if i in ended or step < start[i]:
                    continue
                tokens[i] = min(final[i], tokens[i] + speed[i])
                if tokens[i] == final[i]:
                    ended.add(i)
                    rank += 1
                    if valid[i]:
                        finished.append((final[i], rank, i))
            live = [tokens[i] for i in range(n) if i not in ended]
            if selection_final([f[:2] for f in finished], m, live) and live:
                chosen = sorted(finished)[:m]
                worst = chosen[-1][:2]
                for i in range(n):             # every other sample ends later or longer
                    if i not in ended:
                        assert final[i] > worst[0] or not valid[i] or tokens[i] >= worst[0]
                        assert tokens[i] >= worst[0]
                for f in sorted(finished)[m:]:
                    assert f[:2] > worst
                break
            if len(ended) == n:
                break


def test_annotation_breaks_ties_by_finish_rank():
    infos = [RolloutInfo(Reason.EOS, 10, finish_rank=3), RolloutInfo(Reason.EOS, 10, finish_rank=1),
             RolloutInfo(Reason.EOS, 8, finish_rank=2),
             RolloutInfo(Reason.DARTS_CANCELLED, 10, weight=0.0)]
    out = annotate_group(infos, size=2, k=1, early_stop=True)
    assert [i.selected for i in out] == [False, True, True, False]
    assert [i.weight for i in out] == [0.0, 1.0, 1.0, 0.0]
    assert shortest_selection([5, 5], [True, True], 1, ranks=[2, 1]) == [None, "shortest"]
