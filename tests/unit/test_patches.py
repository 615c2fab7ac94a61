"""Every patch names the vLLM versions it was checked on and fails loudly on another shape.

``check()`` reads the installed vLLM's live objects (a monkeypatched target is what it
sees); ``check(tree)`` reads any release's files (tests/unit/test_compat_check.py mutates them).
"""
import inspect

import pytest
import vllm

import vllm_rl.patches as patches
from vllm_rl.patches import (PatchMismatch, arrol_capture, das_cpu_spec_expand, flags_admission,
                              metrics_records, das_proposer_context)


@pytest.mark.parametrize("mod", patches.all_patches(), ids=lambda m: m.__name__)
def test_installed_vllm_is_a_checked_version(mod):
    assert vllm.__version__.split("+")[0] in mod.CHECKED, (
        f"{mod.__name__} was checked on vLLM {mod.CHECKED}, installed is {vllm.__version__}: "
        "re-check the patch against this version and add it to CHECKED")
    mod.check()


@pytest.mark.parametrize("mod", patches.all_patches(), ids=lambda m: m.__name__)
def test_check_reads_a_source_tree_as_well(mod):
    """The same check on the installed vLLM's files, read without the live objects."""
    from pathlib import Path

    from vllm_rl.compat.source import SourceTree

    tree = SourceTree(Path(vllm.__file__).resolve().parent.parent)
    assert tree.version == vllm.__version__
    mod.check(tree)


def test_plugin_is_registered_and_applies_the_patches():
    from importlib.metadata import entry_points

    from vllm.v1.engine.input_processor import InputProcessor

    from vllm_rl.plugin import register

    assert any(e.value == "vllm_rl.plugin:register"
               for e in entry_points(group="vllm.general_plugins"))
    register()
    assert getattr(InputProcessor.process_inputs, "_vllm_rl_patched", False)


def test_check_fails_loudly_on_a_changed_target(monkeypatch):
    from vllm.v1.engine.input_processor import InputProcessor

    def process_inputs(self, prompt, params, request_id):  # arguments reordered
        return None

    monkeypatch.setattr(InputProcessor, "process_inputs", process_inputs)
    with pytest.raises(PatchMismatch, match="process_inputs"):
        flags_admission.check()


def test_patch_source_is_small():
    lines = inspect.getsource(flags_admission.apply).splitlines()
    assert len(lines) < 40


def test_proposer_context_check_fails_loudly_on_a_changed_target(monkeypatch):
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    def propose_draft_token_ids(self, sampled_token_ids, scheduler_output):  # reordered
        return None

    monkeypatch.setattr(GPUModelRunner, "propose_draft_token_ids", propose_draft_token_ids)
    with pytest.raises(PatchMismatch, match="propose_draft_token_ids"):
        das_proposer_context.check()


def test_proposer_context_binds_the_step_before_vllms_body():
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    das_proposer_context.apply()
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

    das_cpu_spec_expand.apply()
    assert getattr(rs.expand_batch_to_tokens, "_vllm_rl_patched", False)
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
        "vLLM's own CPU expansion is right now: drop patches/das_cpu_spec_expand.py")


def test_arrol_capture_check_fails_loudly_on_a_changed_target(monkeypatch):
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    arrol_capture.check()
    original = GPUModelRunner.sample_tokens

    def sample_tokens(self, grammar_output):     # a vLLM that no longer clears the state
        return original(self, grammar_output)

    monkeypatch.setattr(GPUModelRunner, "sample_tokens", sample_tokens)
    with pytest.raises(PatchMismatch, match="execute_model_state"):
        arrol_capture.check()


def test_arrol_engine_refuses_model_runner_v2():
    from types import SimpleNamespace

    from vllm_rl.arrol.config import CONFIG_KEY, check_runner

    v2 = SimpleNamespace(additional_config={CONFIG_KEY: {}}, use_v2_model_runner=True)
    with pytest.raises(RuntimeError, match="V1 model runner"):
        check_runner(v2)
    check_runner(SimpleNamespace(additional_config={}, use_v2_model_runner=True))
    check_runner(SimpleNamespace(additional_config={CONFIG_KEY: {}}, use_v2_model_runner=False))


def test_output_metrics_check_fails_loudly_on_a_changed_target(monkeypatch):
    from vllm.v1.engine.output_processor import OutputProcessor, RequestState

    metrics_records.check()
    original = RequestState.make_request_output

    def make_request_output(self, new_token_ids, pooling_output, stop_reason, finish_reason):
        return original(self, new_token_ids, pooling_output, finish_reason, stop_reason)

    monkeypatch.setattr(RequestState, "make_request_output", make_request_output)
    with pytest.raises(PatchMismatch, match="make_request_output"):
        metrics_records.check()
    monkeypatch.undo()

    def add_request(self, prompt, request):         # arguments reordered
        return None

    monkeypatch.setattr(OutputProcessor, "add_request", add_request)
    with pytest.raises(PatchMismatch, match="add_request"):
        metrics_records.check()


def test_output_metrics_counts_a_finished_output_before_vllms_body():
    """The wrapper counts a finished output with a record, skips unfinished ones, and
    then runs vLLM's own body; applying twice wraps once."""
    from types import SimpleNamespace

    from vllm.v1.engine import FinishReason
    from vllm.v1.engine.output_processor import RequestState

    from vllm_rl import Reason, RolloutInfo
    from vllm_rl.metrics import snapshot

    metrics_records.apply()
    wrapped = RequestState.make_request_output
    metrics_records.apply()
    assert RequestState.make_request_output is wrapped and wrapped._vllm_rl_patched
    record = RolloutInfo(Reason.DUET_TRIMMED, 20, 1.0).encode()
    key = 'vllm_rl:samples_ended_total{reason="duet_trimmed"}'
    saved = 'vllm_rl:tokens_saved_estimated_total{reason="duet_trimmed"}'
    before = snapshot()
    for finish in (None, FinishReason.ABORT):
        state = SimpleNamespace(max_tokens_param=50, detokenizer=None)
        with pytest.raises(AttributeError):         # vLLM's body ran on the fake state
            RequestState.make_request_output(state, [], None, finish, record)
    after = snapshot()
    assert after[key] - before[key] == 1 and after[saved] - before[saved] == 30


def test_weight_sync_check_fails_loudly_on_a_changed_target(monkeypatch):
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.engine.core import EngineCore

    from vllm_rl.patches import weight_sync

    weight_sync.check()

    def reset_prefix_cache(self, reset_connector=False):     # no reset_running_requests
        return True

    monkeypatch.setattr(Scheduler, "reset_prefix_cache", reset_prefix_cache)
    with pytest.raises(PatchMismatch, match="reset_prefix_cache"):
        weight_sync.check()
    monkeypatch.undo()

    def set_weight_version(self):                            # no label taken
        return None

    monkeypatch.setattr(EngineCore, "set_weight_version", set_weight_version)
    with pytest.raises(PatchMismatch, match="set_weight_version"):
        weight_sync.check()


def test_cpu_seeded_chunks_check_fails_loudly_on_a_changed_target(monkeypatch):
    from vllm.v1.worker.gpu_input_batch import InputBatch

    from vllm_rl.patches import cpu_seeded_chunks

    cpu_seeded_chunks.check()

    def add_request(self, request):                          # keeps no generator
        return 0

    monkeypatch.setattr(InputBatch, "add_request", add_request)
    with pytest.raises(PatchMismatch, match="generator"):
        cpu_seeded_chunks.check()


def test_cpu_seeded_chunks_generator_keeps_the_stream_and_ignores_offsets():
    import torch

    from vllm_rl.patches import cpu_seeded_chunks

    cpu = cpu_seeded_chunks._cpu_generator_class()
    plain, wrapped = torch.Generator(), cpu()
    plain.manual_seed(7)
    wrapped.set_state(plain.get_state())
    wrapped.set_offset(wrapped.get_offset() - 4)              # vLLM's rewind: a no-op
    assert torch.equal(torch.rand(4, generator=plain), torch.rand(4, generator=wrapped))
