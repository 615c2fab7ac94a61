"""The top-level names: the engine API, not the demo kit; the engine takes its model
explicitly, as ``vllm.LLM`` does."""
import inspect

import pytest

DEMO_KIT = ("heldout_prompts", "train_prompts", "reward", "MODEL_PATH")


def test_the_demo_kit_lives_in_vllm_rl_task_not_at_the_top():
    import vllm_rl
    import vllm_rl.task as task

    for name in DEMO_KIT:
        assert name not in vllm_rl.__all__, name
        with pytest.raises(AttributeError):
            getattr(vllm_rl, name)
        assert getattr(task, name) is not None


def test_llm_and_engine_args_take_the_model_explicitly():
    from vllm_rl.llm import LLM, engine_args
    from vllm_rl.task import MODEL_PATH

    for fn in (LLM.__init__, engine_args):
        assert inspect.signature(fn).parameters["model"].default is inspect.Parameter.empty
    with pytest.raises(TypeError, match="model"):
        LLM(das=True)                      # no silent default to the embedded model
    with pytest.raises(TypeError, match="model"):
        engine_args(seed=0)
    assert engine_args(MODEL_PATH).model == str(MODEL_PATH)     # a Path works, as a str
