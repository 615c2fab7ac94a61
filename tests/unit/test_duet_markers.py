"""DUET's marker detectors and per-sample rule (pure functions)."""
import random

import pytest

from vllm_rl.duet import rule as duet
from vllm_rl.duet.markers import (PATTERN_WINDOW, Marker, code_marker, compile_user_pattern,
                                  detector, marker, math_marker, opening_fence, qa_marker)
from vllm_rl.flags import DuetFlags

BOX = "\\boxed{"


@pytest.mark.parametrize("text", [
    f"so {BOX}42}}\n\nThat is all.",
    f"{BOX}\\frac{{1}}{{2}}}}\n\n",                  # nested braces
    f"answer: {BOX}7}} is final:\n",                 # colon at end of line
    f"first {BOX}3 wrong\n\n then {BOX}4}}\n  \n",   # first box unclosed, second fires
])
def test_math_marker_fires(text):
    assert math_marker(text)


@pytest.mark.parametrize("text", [
    f"so {BOX}42",                                   # unclosed
    f"so {BOX}42}}",                                 # closed, but not yet followed by anything
    f"so {BOX}42}}\nmore text",                      # a single newline, then text
    f"{BOX}\\frac{{1}}{{2}}\n\n",                    # inner braces close, box does not
    f"{BOX}42}}: and more\n",                        # colon not at end of line
    "no box at all\n\n",
])
def test_math_marker_near_misses(text):
    assert not math_marker(text)


def test_code_marker_needs_column_zero_and_the_prompt_fence():
    detect = code_marker(opening_fence("Write it:\n```python\n"))
    assert detect("def f():\n    return 1\n```\n")
    assert not detect("def f():\n    ```\n")            # not at column zero
    assert not detect("def f():\n```")                  # fence line not finished
    long = code_marker(opening_fence("````python\n"))
    assert not long("x = 1\n```\n") and long("x = 1\n````\n")


def test_qa_marker():
    assert qa_marker("think... <answer>12</answer>")
    assert qa_marker("Therefore the answer is 12.")
    assert not qa_marker("think... <answer>12")
    assert not qa_marker("Therefore the answer is 12")    # sentence not finished


def test_user_patterns_are_re2_and_bounded():
    assert compile_user_pattern(r"= \d+ ;")("4 + 3 = 7 ;")
    for bad in [r"(a)\1", r"(?=x)y", "x" * 300, "(", ""]:
        with pytest.raises(ValueError):
            compile_user_pattern(bad)
    # A pattern that backtracks exponentially in Python's re is linear in RE2.
    evil = compile_user_pattern(r"(a+)+$")
    assert not evil("a" * 5000 + "b")
    assert detector("math", r"xyz", "")("..xyz..")


class FiresAt(Marker):
    """A detector that records its polls and fires once ``at`` tokens were fed."""

    def __init__(self, at: int = 1 << 30) -> None:
        self.at, self.polled = at, []

    def poll(self, table, tokens) -> bool:
        self.polled.append(len(tokens))
        return len(tokens) >= self.at


def _state(k1=0, k2=20, grace=10, eps=0.5, poll=8, coin=0.9, at=1 << 30):
    flags = DuetFlags(marker="math", pattern=None, k1=k1, k2=k2, grace=grace, eps=eps, poll=poll)
    return duet.DuetState(flags=flags, detector=FiresAt(at), k1=k1, k2=k2, coin=coin)


def _run(state, t: int):
    """step() as the engine calls it: only once ``next_check`` is reached."""
    if t < state.next_check:
        return None
    return duet.step(state, t, [7] * t, TABLE)


def test_rule_polls_from_k1_every_poll_tokens_and_trims_at_the_marker():
    state = _state(k1=10, poll=8, k2=1000, at=30)
    for t in range(1, 40):
        action = _run(state, t)
        if action:
            break
    assert state.detector.polled == [10, 16, 24, 32]
    assert action is duet.Action.TRIM and state.marker_pos == 32 and state.keep_prob == 1.0


@pytest.mark.parametrize("coin, expected", [(0.9, duet.Action.ABORT), (0.1, None)])
def test_gate_at_k2_plus_g_follows_the_coin(coin, expected):
    state = _state(k2=20, grace=10, eps=0.5, coin=coin)
    actions = [_run(state, t) for t in range(1, 31)]
    assert actions[:29] == [None] * 29 and actions[29] is expected
    assert state.keep_decided and state.keep_prob == 0.5
    if expected is None:   # eps-kept: weight 1/eps, never trimmed or gated again
        assert state.weight == 2.0 and state.next_check > 1 << 40
        state.detector.at = 0
        assert all(duet.step(state, t, [7] * t, TABLE) is None for t in range(31, 80))


def _decision(state, ends):
    """What the rule decides for a sample whose steps end at the token counts ``ends``:
    (action, whether the gate drew its coin), at the first step that decides."""
    for t in ends:
        action = _run(state, t)
        if action is not None or state.keep_decided:
            return action, state.keep_decided
    return None, False


def test_a_marker_after_k2_plus_g_in_a_multi_token_step_meets_the_coin():
    """Steps of one token: no marker by the last poll before K2 + G = 30 (24), so the
    coin decides at 30.  A speculative step from 28 to 33 passes the gate with the
    marker at token 32: the poll reads no further than 24, and the coin decides."""
    one = _state(k1=8, poll=8, k2=20, grace=10, coin=0.9, at=32)
    assert _decision(one, range(1, 40)) == (duet.Action.ABORT, True)
    jump = _state(k1=8, poll=8, k2=20, grace=10, coin=0.9, at=32)
    assert _decision(jump, [8, 16, 24, 28, 33]) == (duet.Action.ABORT, True)
    assert jump.detector.polled == [8, 16, 24]


def test_the_rule_decides_the_same_whatever_the_steps_sizes():
    """Random K1, poll, K2, G, marker positions and coins: steps of 1-9 tokens decide
    as steps of one token do (trim, the coin's abort or its keep)."""
    rng = random.Random(0)
    for _ in range(2000):
        k1, poll = rng.randint(0, 40), rng.randint(1, 12)
        k2, grace, at = rng.randint(0, 80), rng.randint(0, 12), rng.randint(1, 120)
        coin = rng.random()
        ends, t = [], 0
        while t < 130:
            t += rng.randint(1, 9)
            ends.append(t)
        args = dict(k1=k1, poll=poll, k2=k2, grace=grace, eps=0.5, coin=coin, at=at)
        assert _decision(_state(**args), ends) == _decision(_state(**args), range(1, 140)), args


# ---------------------------------------------------------------- incremental markers
PIECES = ["\\boxed{", "{", "}", "\n", " ", ":", "a", "7", "```", "`", "<answer>", "</answer>",
          "Therefore the answer is ", ".", "x", "\n\n", "\u00e9", "y" * 700]
TABLE = [p.encode() for p in PIECES]


@pytest.mark.parametrize("kind", ["math", "code", "qa"])
def test_incremental_markers_answer_what_the_text_functions_answer(kind):
    """At every poll, on random outputs polled at random points, the incremental form
    on token bytes says exactly what the text function says on the whole output."""
    rng = random.Random(kind)
    reference = detector(kind, None, "```")
    for _ in range(1500):
        ids = [rng.randrange(len(PIECES)) for _ in range(rng.randint(1, 60))]
        inc, pos = marker(kind, None, "```"), 0
        while pos < len(ids):
            pos = min(len(ids), pos + rng.randint(1, 6))
            want = reference("".join(PIECES[i] for i in ids[:pos]))
            assert inc.poll(TABLE, ids[:pos]) == want, ids[:pos]
            if want:
                break


def test_incremental_markers_keep_little_of_a_long_output():
    inc = marker("math", None)
    ids = [PIECES.index("y" * 700)] * 200
    for n in range(1, 201):
        assert not inc.poll(TABLE, ids[:n])
    assert len(inc.buf) < 8192


def test_pattern_marker_reads_the_last_window_of_token_bytes():
    inc = marker("math", r"= \d+ ;")
    table = [b"=", b" 7", b" ;", b" x"]
    assert not inc.poll(table, [0, 1, 3])
    assert inc.poll(table, [0, 1, 2])
    assert not inc.poll(table, [0, 1, 2] + [3] * PATTERN_WINDOW)      # out of the window


def test_coin_is_reproducible_from_the_seed_and_prompt_and_uniform():
    coin = duet.seeded_coin
    assert coin(7, [1, 2], "a") == coin(7, [1, 2], "b")     # seeded: the request id is unused
    assert coin(7, [1, 2], "a") != coin(8, [1, 2], "a")
    assert coin(7, [1, 2], "a") != coin(7, [1, 3], "a")     # same seed, another prompt
    assert coin(None, [1], "a") != coin(None, [1], "b")
    coins = [coin(s, [s % 7], "x") for s in range(4000)]
    assert abs(sum(c < 0.05 for c in coins) / 4000 - 0.05) < 0.015


def test_online_thresholds_cold_start_window_and_refit():
    est = duet.OnlineThresholds(window=5, refit_every=2)
    assert est.thresholds(1000) == (300, 700)
    for n in [10, 20, 30, 40, 50, 60, 70]:
        est.observe(n)
    assert [o[0] for o in est.observations] == [30, 40, 50, 60, 70]
    est.end_round()
    assert est.thresholds(1000) == (300, 700)       # refit only every 2 rounds
    est.end_round()
    assert est.thresholds(1000) == (40, 60)         # p30, p80 of 30..70 (Kaplan-Meier)
