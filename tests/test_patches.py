"""Every patch names the vLLM versions it was checked on and fails loudly on another shape."""
import inspect

import pytest
import vllm

import vllm_rl.patches as patches
from vllm_rl.patches import PatchMismatch, input_validation


@pytest.mark.parametrize("mod", patches.all_patches(), ids=lambda m: m.__name__)
def test_installed_vllm_is_a_checked_version(mod):
    assert vllm.__version__.split("+")[0] in mod.CHECKED, (
        f"{mod.__name__} was checked on vLLM {mod.CHECKED}, installed is {vllm.__version__}: "
        "re-check the patch against this version and add it to CHECKED")
    mod.check()


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
        input_validation.check()


def test_patch_source_is_small():
    lines = inspect.getsource(input_validation.apply).splitlines()
    assert len(lines) < 40
