"""``python -m vllm_rl.compat.check``: the patch checks and the contracts (RL scheduler,
reload pause, imports) read vLLM's sources without importing them, pass on the installed
vLLM's files, and fail on sources where what vllm_rl relies on is gone.

No download here: the checker is pointed at the installed package's folder, or at a
wheel built from it in ``tmp_path``.  Each mutation test writes a changed copy of one
vLLM file into a tree under ``tmp_path`` (every other file a link to the installed one).
"""
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from vllm_rl.compat import contracts
from vllm_rl.compat.check import main, run, source_for
from vllm_rl.compat.source import SourceTree
from vllm_rl.patches import PatchMismatch
from vllm_rl.patches.config import DasAsyncConfig
from vllm_rl.patches.input_processor import FlagsAdmission
from vllm_rl.patches.model_runner.arrol_capture import ArrolCapture
from vllm_rl.patches.model_runner.das_async import DasAsyncRunner
from vllm_rl.patches.model_runner.das_context import DasProposerContext
from vllm_rl.patches.openai_serving import RecordOnChoices
from vllm_rl.patches.output_processor import RecordField
from vllm_rl.patches.rejection_sampler import CpuSpecExpand


def _site() -> Path:
    """The folder holding the installed ``vllm`` package, found without importing it."""
    import importlib.util

    return Path(importlib.util.find_spec("vllm").origin).resolve().parent.parent


SITE = _site()


def mutated(tmp_path: Path, module: str, old: str, new: str, count: int | None = 1) -> SourceTree:
    """The installed sources with ``old`` replaced by ``new`` in ``module``'s file (a real
    copy in ``tmp_path``; every other file and folder a symlink to the installed one)."""
    root = tmp_path / "src"
    root.mkdir(exist_ok=True)
    rel = SourceTree(SITE).path(module).relative_to(SITE)
    src_dir, dst_dir = SITE, root
    for part in rel.parts[:-1]:
        src_dir, dst_dir = src_dir / part, dst_dir / part
        if dst_dir.is_symlink():
            dst_dir.unlink()
        if not dst_dir.exists():
            dst_dir.mkdir()
            for child in src_dir.iterdir():
                (dst_dir / child.name).symlink_to(child)
    text = (SITE / rel).read_text()
    found = text.count(old)
    assert found and (count is None or found == count), (module, old, found)
    target = root / rel
    target.unlink()
    target.write_text(text.replace(old, new))
    return SourceTree(root)


# ------------------------------------------------------------------ the installed sources
def test_checker_passes_on_the_installed_package_without_importing_it():
    """The table lists every patch and contract, all ok, and the process never imported
    vLLM (the sources are read, not run)."""
    code = ("import sys; from vllm_rl.compat.check import main; rc = main([sys.argv[1]]); "
            "assert 'vllm' not in sys.modules, 'vllm was imported'; sys.exit(rc)")
    out = subprocess.run([sys.executable, "-c", code, str(SITE / "vllm")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("vLLM 0.32.0 ")
    assert lines[1].split() == ["check", "target", "result"]
    rows = {line.split()[0] + (" " + line.split()[1] if line.startswith("patch ") else ""): line
            for line in lines[3:-1]}
    for name in ("patch FlagsAdmission", "patch DasProposerContext", "patch CpuSpecExpand",
                 "patch ArrolCapture", "patch RecordField", "patch RecordOnChoices",
                 "patch DasAsyncConfig", "patch DasAsyncRunner",
                 *(c.name for c in contracts.ALL)):
        assert name in rows and " ok" in rows[name], (name, out.stdout)
    assert lines[-1] == f"{len(rows)}/{len(rows)} checks pass"


def test_checker_reads_a_wheel_and_a_cached_version(tmp_path, monkeypatch):
    """A ``.whl`` is unpacked (its .py files) into the cache once; a version whose wheel
    is in the cache is not downloaded again."""
    cache = tmp_path / "cache"
    wheel = cache / "wheels" / "vllm-0.32.0-py3-none-any.whl"
    wheel.parent.mkdir(parents=True)
    with zipfile.ZipFile(wheel, "w") as z:
        for path in (SITE / "vllm").rglob("*.py"):
            z.write(path, path.relative_to(SITE).as_posix())
        z.writestr("vllm-0.32.0.dist-info/METADATA", "Name: vllm\nVersion: 0.32.0\n")
        z.writestr("vllm/_C.abi3.so", b"\0")                  # binaries are not unpacked

    def no_download(*args, **kwargs):
        raise AssertionError(f"downloaded although cached: {args}")

    monkeypatch.setattr(subprocess, "run", no_download)
    src = source_for("0.32.0", cache)
    assert src.version == "0.32.0" and (src.root / ".complete").exists()
    assert not (src.root / "vllm" / "_C.abi3.so").exists()
    assert all(r.ok for r in run(src)), [r for r in run(src) if not r.ok]
    assert source_for(str(wheel), cache).root == src.root                 # unpacked once


def test_checker_exit_status_and_a_version_not_in_checked(tmp_path, capsys):
    """A release that passes but is not in a patch's CHECKED says so; a failing check
    makes the exit status 1, a target that is not vLLM 2."""
    src = mutated(tmp_path, "vllm._version", "'0.32.0'", "'0.32.9'", count=None)
    rows = run(src)
    assert all(r.ok for r in rows)
    assert all("0.32.9 not in checked" in r.result for r in rows if r.check.startswith("patch"))
    mutated(tmp_path, "vllm.v1.engine.output_processor",
            "self.request_states[request_id] = req_state", "self._put(request_id, req_state)")
    assert main([str(tmp_path / "src")]) == 1
    assert "FAIL: " in capsys.readouterr().out
    assert main([str(tmp_path)]) == 2


# ------------------------------------------------------------------ patch checks, mutated
@pytest.mark.parametrize("module", ["vllm.v1.engine.llm_engine", "vllm.v1.engine.async_llm"])
def test_fan_out_check_is_not_fooled_by_request_params(tmp_path, module):
    """Without the fan-out ``params = request.params`` the check fails, although the file
    still has ``request_params = request.params`` (which the old substring check took)."""
    src = mutated(tmp_path, module, "        params = request.params\n", "")
    assert "params = request.params" in src.text(module)     # what fooled the substring
    with pytest.raises(PatchMismatch, match="fans out n > 1"):
        FlagsAdmission.check(src)


MUTATIONS = {
    "own params": (FlagsAdmission, "vllm.v1.engine.input_processor", "params.clone()",
                   "params  # no params.clone()", None, "its own params"),
    "async path": (FlagsAdmission, "vllm.v1.engine.input_processor",
                   "make_async(\n            self.process_inputs,",
                   "make_async(\n            self._process,", 1, "process_inputs_async"),
    "custom_class": (DasProposerContext, "vllm.v1.worker.gpu_model_runner",
                     'elif spec_config.method == "custom_class":',
                     'elif spec_config.method == "custom_class_v2":', 1, "custom_class"),
    "async check": (DasAsyncConfig, "vllm.config.vllm", "not in get_args(NgramGPUTypes)",
                    "not in NGRAM_GPU_METHODS", None, "NgramGPUTypes"),
    "async bookkeeping": (DasAsyncRunner, "vllm.v1.worker.gpu_model_runner",
                          "if self.input_batch.prev_sampled_token_ids is None:\n"
                          "                assert sampled_token_ids.shape[-1] == 1",
                          "if not self.input_batch.has_prev:\n"
                          "                assert sampled_token_ids.shape[-1] == 1", 1,
                          "previous tokens"),
    "async placeholders": (DasAsyncRunner, "vllm.v1.core.sched.async_scheduler",
                           "* scheduler_output.num_spec_tokens_to_schedule",
                           "* self.num_spec_tokens", 1, "placeholder"),
    "expand by name": (CpuSpecExpand, "vllm.v1.sample.rejection_sampler",
                       "= expand_batch_to_tokens(", "= _expand_to_tokens(", None,
                       "no longer expands"),
    "state cleared": (ArrolCapture, "vllm.v1.worker.gpu_model_runner",
                      "        self.execute_model_state = None\n",
                      "        pass  # self.execute_model_state = None\n", 1,
                      "execute_model_state"),
    "output returned": (ArrolCapture, "vllm.v1.worker.gpu_model_runner",
                        "        return output\n\n\ndef _copy_pooler_output_to_cpu(",
                        "        return None\n\n\ndef _copy_pooler_output_to_cpu(", 1,
                        "returning its output"),
    "stop_reason given": (RecordField, "vllm.v1.engine.output_processor",
                          "stop_reason=stop_reason if finished else None,",
                          "stop_reason=None,", 1, "stop_reason"),
    "choices numbered": (RecordOnChoices, "vllm.entrypoints.openai.completion.serving",
                         "i = output.index + prompt_idx * num_choices",
                         "i = prompt_idx * num_choices + output.index", 1, "numbers"),
    "state stored": (RecordField, "vllm.v1.engine.output_processor",
                     "self.request_states[request_id] = req_state",
                     "self._put(request_id, req_state)", 1, "request_states"),
}


@pytest.mark.parametrize("case", list(MUTATIONS))
def test_patch_checks_fail_on_mutated_sources(tmp_path, case):
    patch, module, old, new, count, message = MUTATIONS[case]
    patch.check(SourceTree(SITE))                            # the real file passes
    with pytest.raises(PatchMismatch, match=message):
        patch.check(mutated(tmp_path, module, old, new, count))


# ------------------------------------------------------------------ contracts, mutated
CONTRACT_MUTATIONS = {
    "the final output built before _free_request": (
        contracts.scheduler_record_before_output, "vllm.v1.core.sched.scheduler",
        "stop_reason=request.stop_reason,", "stop_reason=None,", 1, "stop_reason"),
    "free through _free_request": (
        contracts.scheduler_free_request, "vllm.v1.core.sched.scheduler",
        "self._free_request(request, delay_free_blocks=delay_free_blocks)",
        "self._release(request, delay_free_blocks)", 1, "finish_requests"),
    "finish_requests returns": (
        contracts.scheduler_finish_requests, "vllm.v1.core.sched.scheduler",
        ") -> list[Request]:\n        \"\"\"Handles the finish signal",
        ") -> None:\n        \"\"\"Handles the finish signal", 1, "list\\[Request\\]"),
    "pause rejects arrivals": (
        contracts.reload_parks_requests, "vllm.v1.engine.core",
        "self.scheduler.set_pause_state(pause_state)",
        "self.scheduler.set_pause_state(pause_state)\n        self.reject_new_requests = True",
        None, "rejects requests"),
    "an import gone": (
        contracts.imports_resolve, "vllm.v1.engine",
        "class EngineCoreOutputs(", "class EngineCoreOutputsV2(", 1, "EngineCoreOutputs"),
}


@pytest.mark.parametrize("case", list(CONTRACT_MUTATIONS))
def test_contracts_fail_on_mutated_sources(tmp_path, case):
    check, module, old, new, count, message = CONTRACT_MUTATIONS[case]
    check(SourceTree(SITE))
    with pytest.raises(PatchMismatch, match=message):
        check(mutated(tmp_path, module, old, new, count))


def test_contracts_hold_on_the_live_installed_vllm():
    """The same contracts through the installed vLLM's live objects (engine start)."""
    contracts.check()
