"""``--host-load``: the busy processes the benches run beside the engine."""
import os
from types import SimpleNamespace

import pytest

from vllm_rl.bench.host_load import HostLoad
from vllm_rl.bench.points import rests_on


def test_the_load_spins_on_this_process_cpus_and_stops_on_exit():
    load = HostLoad(2)
    with load:
        procs = list(load._procs)
        assert len(procs) == 2 and all(p.poll() is None for p in procs)
        assert all(os.sched_getaffinity(p.pid) == os.sched_getaffinity(0) for p in procs)
    assert all(p.returncode is not None for p in procs) and not load._procs


def test_no_load_starts_nothing_and_a_negative_one_is_refused():
    with HostLoad(0) as load:
        assert not load._procs
    with pytest.raises(ValueError, match="processes"):
        HostLoad(-1)


def test_a_loaded_run_says_so_where_it_says_what_it_rests_on():
    args = SimpleNamespace(m=8, history=2, prompt_seed=5, task="arith", host_load=1)
    assert "1 process(es) spinning beside the engine" in rests_on(args)
    assert "spinning" not in rests_on(SimpleNamespace(m=8, history=2, prompt_seed=None,
                                                      task="arith"))
