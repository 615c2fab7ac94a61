"""The DAS drafter's admissions within one step (:class:`vllm_rl.das.requests._Admissions`)."""
from __future__ import annotations

from vllm_rl import rl_params
from vllm_rl.das import requests as das_requests


def test_a_step_reads_one_groups_flags_once_per_object(monkeypatch):
    reads = []
    real = das_requests._das_flags

    def counted(extra_args, request_id):
        reads.append(request_id)
        return real(extra_args, request_id)

    monkeypatch.setattr(das_requests, "_das_flags", counted)
    memo = das_requests._Admissions()
    group = rl_params(das={"problem_id": "p"})
    other = rl_params(das={"problem_id": "q", "budget": 2})
    flags = [memo.flags(group, f"g-{i}") for i in range(8)]
    assert reads == ["g-0"]                      # the group's samples share one object
    assert all(f is flags[0] for f in flags) and flags[0].das.problem_id == "p"
    assert memo.flags(other, "o-0").das.budget == 2
    assert memo.flags(None, "n-0") is None                # no flags: nothing to read
    assert memo.flags(group, "g-8") is flags[0]           # groups may interleave
    # an equal dict that is another object is read again: the memo keys on identity
    assert memo.flags(dict(group), "g-copy").das.problem_id == "p"
    assert reads == ["g-0", "o-0", "g-copy"]
    # the next step's admissions start afresh
    assert das_requests._Admissions().flags(group, "g-next").das.problem_id == "p"
    assert reads[-1] == "g-next"
