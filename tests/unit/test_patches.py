"""Every patch names the vLLM versions it was checked on and fails loudly on another shape.

``check()`` reads the installed vLLM's live objects (a monkeypatched target is what it
sees); ``check(tree)`` reads any release's files (tests/unit/test_compat_check.py mutates them).
"""
import inspect
import os

import pytest
import vllm

import vllm_rl.patches as patches
from vllm_rl.patches import (Patch, PatchConflict, PatchMismatch, applied, input_batch,
                              input_processor)
from vllm_rl.patches.engine_core import EngineCoreCalls
from vllm_rl.patches.input_batch import CpuSeededChunks
from vllm_rl.patches.input_processor import FlagsAdmission
from vllm_rl.patches.model_runner.arrol_capture import ArrolCapture
from vllm_rl.patches.model_runner.das_context import DasProposerContext
from vllm_rl.patches.output_processor import RecordField
from vllm_rl.patches.rejection_sampler import CpuSpecExpand


@pytest.mark.parametrize("patch", patches.all_patches(), ids=lambda p: p.name())
def test_installed_vllm_is_a_checked_version(patch):
    assert vllm.__version__.split("+")[0] in patch.checked, (
        f"{patch.name()} was checked on vLLM {patch.checked}, installed is "
        f"{vllm.__version__}: re-check the patch against this version and add it")
    patch.check()


@pytest.mark.parametrize("patch", patches.all_patches(), ids=lambda p: p.name())
def test_check_reads_a_source_tree_as_well(patch):
    """The same check on the installed vLLM's files, read without the live objects."""
    from pathlib import Path

    from vllm_rl.compat.source import SourceTree

    tree = SourceTree(Path(vllm.__file__).resolve().parent.parent)
    assert tree.version == vllm.__version__
    patch.check(tree)


def test_registry_refuses_two_patches_on_one_target_without_an_order(monkeypatch):
    """Every target is patched once, or in a declared order; the order puts a patch
    after those it names, and apply_all applies each once (remembered, not marked)."""
    found = patches.all_patches()
    names = [p.name() for p in found]
    assert names.index("DasAsyncRunner") > names.index("ArrolCapture")
    shared = "vllm.v1.worker.gpu_model_runner.GPUModelRunner.sample_tokens"

    class Rogue(Patch):
        targets = (shared,)

    with pytest.raises(PatchConflict, match="both patch"):
        patches._check_targets(found + [Rogue])

    class Late(Patch):
        targets = (shared,)
        after = ("ArrolCapture", "DasAsyncRunner")

    patches._check_targets(found + [Late])           # declared: accepted
    assert patches._ordered(found + [Late])[-1] is Late


def test_apply_twice_wraps_once():
    from vllm.v1.engine.input_processor import InputProcessor

    patches.apply_all()
    wrapped = InputProcessor.process_inputs
    patches.apply_all()
    FlagsAdmission.apply()
    assert InputProcessor.process_inputs is wrapped and applied(FlagsAdmission)
    assert all(applied(p) for p in patches.all_patches())


def test_plugin_is_registered_and_patches_only_where_asked(monkeypatch):
    from importlib.metadata import entry_points

    from vllm.v1.engine.input_processor import InputProcessor

    from vllm_rl import plugin

    assert any(e.value == "vllm_rl.plugin:register"
               for e in entry_points(group="vllm.general_plugins"))
    calls = []
    monkeypatch.setattr(patches, "apply_all", lambda: calls.append(1))
    monkeypatch.delenv(plugin.ENGINE_ENV, raising=False)
    plugin.register()                       # a process that did not ask: nothing
    assert calls == []
    monkeypatch.setenv(plugin.ENGINE_ENV, "1")
    plugin.register()
    assert calls == [1]
    monkeypatch.undo()
    monkeypatch.delenv(plugin.ENGINE_ENV, raising=False)
    plugin.enable()                         # the RL engine's factories: asked, and applied
    assert os.environ[plugin.ENGINE_ENV] == "1"
    assert applied(FlagsAdmission) and InputProcessor.process_inputs.__wrapped__


def test_rl_scheduler_refuses_a_process_without_the_patches(monkeypatch):
    from vllm_rl.engine.scheduler import check_patched
    from vllm_rl.plugin import ENGINE_ENV

    monkeypatch.delenv(ENGINE_ENV, raising=False)
    with pytest.raises(RuntimeError, match=ENGINE_ENV):
        check_patched()
    monkeypatch.setenv(ENGINE_ENV, "1")
    check_patched()


def test_check_fails_loudly_on_a_changed_target(monkeypatch):
    from vllm.v1.engine.input_processor import InputProcessor

    def process_inputs(self, prompt, params, request_id):  # arguments reordered
        return None

    monkeypatch.setattr(InputProcessor, "process_inputs", process_inputs)
    with pytest.raises(PatchMismatch, match="process_inputs"):
        FlagsAdmission.check()


def test_patch_source_is_small():
    lines = inspect.getsource(input_processor._apply).splitlines()
    assert len(lines) < 40


def test_proposer_context_check_fails_loudly_on_a_changed_target(monkeypatch):
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    def propose_draft_token_ids(self, sampled_token_ids, scheduler_output):  # reordered
        return None

    monkeypatch.setattr(GPUModelRunner, "propose_draft_token_ids", propose_draft_token_ids)
    with pytest.raises(PatchMismatch, match="propose_draft_token_ids"):
        DasProposerContext.check()


def test_proposer_context_binds_the_step_before_vllms_body():
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    patches.apply_all()
    calls = []

    class Drafter:
        def bind_step(self, runner, scheduler_output):
            calls.append((runner, scheduler_output))

    runner = GPUModelRunner.__new__(GPUModelRunner)
    runner.drafter = Drafter()
    with pytest.raises(AttributeError, match="total_num_scheduled_tokens"):  # vLLM's body ran
        GPUModelRunner.propose_draft_token_ids(runner, "sched", [[1]], None, None, None,
                                               None, None, None, None)
    assert calls == [(runner, "sched")]


def test_cpu_expand_patch_fixes_vllms_expansion_of_sampling_params():
    """vLLM 0.32.0's CPU expand kernel writes into a temporary int64 copy and drops it,
    so the temperatures of draft positions are garbage; the patch expands correctly."""
    import torch
    from vllm.v1.sample import rejection_sampler as rs

    patches.apply_all()
    assert applied(CpuSpecExpand)
    cu = torch.tensor([3, 3, 5], dtype=torch.int32)
    temps = torch.tensor([0.5, 0.7, 0.0], dtype=torch.float32)
    got = rs.expand_batch_to_tokens(temps, cu, 5, replace_from=0, replace_to=1)
    assert got.tolist() == [0.5, 0.5, 0.5, 1.0, 1.0]
    ks = torch.tensor([4, 9, 2], dtype=torch.int32)
    assert rs.expand_batch_to_tokens(ks, cu, 5).tolist() == [4, 4, 4, 2, 2]
    from vllm.platforms import current_platform

    current_platform.register_triton_kernel_overrides()   # what a CPU worker does
    stock = rs.expand_batch_to_tokens.__wrapped__(temps, cu, 5, 0, 1)
    assert stock.tolist() != got.tolist(), (
        "vLLM's own CPU expansion is right now: drop patches/rejection_sampler.py")


def test_arrol_capture_check_fails_loudly_on_a_changed_target(monkeypatch):
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    ArrolCapture.check()
    original = GPUModelRunner.sample_tokens

    def sample_tokens(self, grammar_output):     # a vLLM that no longer clears the state
        return original(self, grammar_output)

    monkeypatch.setattr(GPUModelRunner, "sample_tokens", sample_tokens)
    with pytest.raises(PatchMismatch, match="execute_model_state"):
        ArrolCapture.check()


def test_arrol_engine_refuses_model_runner_v2():
    from types import SimpleNamespace

    from vllm_rl.arrol.config import CONFIG_KEY, check_runner

    v2 = SimpleNamespace(additional_config={CONFIG_KEY: {}}, use_v2_model_runner=True)
    with pytest.raises(RuntimeError, match="V1 model runner"):
        check_runner(v2)
    check_runner(SimpleNamespace(additional_config={}, use_v2_model_runner=True))
    check_runner(SimpleNamespace(additional_config={CONFIG_KEY: {}}, use_v2_model_runner=False))


def test_record_field_check_fails_loudly_on_a_changed_target(monkeypatch):
    from vllm.v1.engine.output_processor import OutputProcessor, RequestState

    RecordField.check()
    original = RequestState._new_completion_output

    def _new_completion_output(self, token_ids, stop_reason, finish_reason):   # reordered
        return original(self, token_ids, finish_reason, stop_reason)

    monkeypatch.setattr(RequestState, "_new_completion_output", _new_completion_output)
    with pytest.raises(PatchMismatch, match="_new_completion_output"):
        RecordField.check()
    monkeypatch.undo()

    def add_request(self, prompt, request):         # arguments reordered
        return None

    monkeypatch.setattr(OutputProcessor, "add_request", add_request)
    with pytest.raises(PatchMismatch, match="add_request"):
        RecordField.check()


def _state(tokens, max_tokens=50):
    """The parts of vLLM's ``RequestState`` its ``_new_completion_output`` reads."""
    from types import SimpleNamespace

    from vllm.sampling_params import RequestOutputKind

    detok = SimpleNamespace(output_token_ids=tokens, num_output_tokens=lambda: len(tokens),
                            get_next_output_text=lambda finished, delta: "text")
    return SimpleNamespace(
        detokenizer=detok, output_kind=RequestOutputKind.FINAL_ONLY, request_index=0,
        logprobs_processor=SimpleNamespace(logprobs=None, cumulative_logprob=None),
        sampling_mask_chunks=[], routed_experts_chunks=[], spec_decode_metrics=None,
        _weight_version_spans=lambda: None, max_tokens_param=max_tokens)


def test_record_leaves_stop_reason_for_its_own_field_and_is_counted():
    """The carrier is taken out: the completion has vLLM's stop_reason (the record's
    ``stop``) and the record as ``rollout_info``; the sample is counted once; an
    unfinished output and an output without a record are vLLM's own."""
    from vllm.v1.engine import FinishReason
    from vllm.v1.engine.output_processor import RequestState

    from vllm_rl import Reason, RolloutInfo
    from vllm_rl.metrics import snapshot

    patches.apply_all()
    record = RolloutInfo(Reason.DUET_TRIMMED, 20, 1.0, stop="</answer>")
    key = 'vllm_rl:samples_ended_total{reason="duet_trimmed"}'
    saved = 'vllm_rl:tokens_saved_estimated_total{reason="duet_trimmed"}'
    before = snapshot()
    new = RequestState._new_completion_output
    out = new(_state([1] * 20), [], FinishReason.STOP, record.encode())
    assert out.stop_reason == "</answer>" and out.rollout_info == record
    assert out.finish_reason == "stop"
    running = new(_state([1] * 5), [], None, None)
    assert running.stop_reason is None and not hasattr(running, "rollout_info")
    stock = new(_state([1] * 3), [], FinishReason.STOP, 7)
    assert stock.stop_reason == 7 and not hasattr(stock, "rollout_info")
    after = snapshot()
    assert after[key] - before[key] == 1 and after[saved] - before[saved] == 30


def test_weight_sync_check_fails_loudly_on_a_changed_target(monkeypatch):
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.engine.core import EngineCore

    EngineCoreCalls.check()

    def reset_prefix_cache(self, reset_connector=False):     # no reset_running_requests
        return True

    monkeypatch.setattr(Scheduler, "reset_prefix_cache", reset_prefix_cache)
    with pytest.raises(PatchMismatch, match="reset_prefix_cache"):
        EngineCoreCalls.check()
    monkeypatch.undo()

    def set_weight_version(self):                            # no label taken
        return None

    monkeypatch.setattr(EngineCore, "set_weight_version", set_weight_version)
    with pytest.raises(PatchMismatch, match="set_weight_version"):
        EngineCoreCalls.check()


def test_cpu_seeded_chunks_check_fails_loudly_on_a_changed_target(monkeypatch):
    from vllm.v1.worker.gpu_input_batch import InputBatch

    CpuSeededChunks.check()

    def add_request(self, request):                          # keeps no generator
        return 0

    monkeypatch.setattr(InputBatch, "add_request", add_request)
    with pytest.raises(PatchMismatch, match="generator"):
        CpuSeededChunks.check()


def test_cpu_seeded_chunks_generator_keeps_the_stream_and_ignores_offsets():
    import torch

    cpu = input_batch._cpu_generator_class()
    plain, wrapped = torch.Generator(), cpu()
    plain.manual_seed(7)
    wrapped.set_state(plain.get_state())
    wrapped.set_offset(wrapped.get_offset() - 4)              # vLLM's rewind: a no-op
    assert torch.equal(torch.rand(4, generator=plain), torch.rand(4, generator=wrapped))


def test_a_record_survives_vllms_merge_of_streamed_outputs():
    """AsyncLLM merges outputs a slow consumer has not read (``RequestOutput.add``); the
    final output's record is carried into the merged completion."""
    from vllm.outputs import CompletionOutput, RequestOutput

    from vllm_rl import Reason, RolloutInfo

    patches.apply_all()

    def output(text, finish=None, info=None):
        c = CompletionOutput(index=0, text=text, token_ids=[1], cumulative_logprob=None,
                             logprobs=None, finish_reason=finish, stop_reason=None)
        if info is not None:
            c.rollout_info = info
        return RequestOutput(request_id="r", prompt=None, prompt_token_ids=[1],
                             prompt_logprobs=None, outputs=[c], finished=finish is not None)

    record = RolloutInfo(Reason.DARTS_CANCELLED, 2, 0.0)
    merged = output("a")
    merged.add(output("b", "abort", record), aggregate=True)
    assert merged.outputs[0].text == "ab" and merged.outputs[0].rollout_info == record
