"""DAS engine settings: validation, the engine arguments they imply, the server flags."""
import json

import pytest

from vllm_rl.das.config import CONFIG_KEY, PROPOSER, DASConfig, default_problem_id


def test_defaults_and_engine_kwargs():
    cfg = DASConfig.of(True)
    assert (cfg.budget, cfg.window, cfg.min_prob, cfg.prior) == (4, 16, None, 0.5)
    # the confidence cap (the default) cuts at its own price; the others at 0.1
    assert cfg.batch_cap == "confidence" and cfg.draft_cutoff == 0.0
    assert DASConfig(batch_cap="cost").draft_cutoff == 0.1
    assert DASConfig(batch_cap="cost", min_prob=0.3).draft_cutoff == 0.3
    kw = cfg.engine_kwargs()
    assert kw["speculative_config"] == {"method": "custom_class", "model": PROPOSER,
                                        "num_speculative_tokens": 8}
    assert "async_scheduling" not in kw and "scheduler_cls" not in kw   # EngineSettings'
    assert kw["additional_config"][CONFIG_KEY]["window"] == 16
    assert cfg.async_scheduling is True


def test_scheduling_follows_das_async_and_the_cpu_key():
    from vllm_rl.settings import CPU_ASYNC_KEY, EngineSettings, on_cpu

    on = EngineSettings.of(das=True)
    off = EngineSettings.of(das={"async_scheduling": False})
    key = {CPU_ASYNC_KEY: True}
    assert on.scheduling(key) == {"scheduler_cls": "vllm_rl.engine.scheduler.RLScheduler",
                                  "async_scheduling": True}
    assert off.scheduling(key)["scheduler_cls"].endswith("RLSyncScheduler")
    assert off.scheduling(key)["async_scheduling"] is False
    # vLLM's CPU platform schedules synchronously unless the engine asks
    assert on.scheduling()["async_scheduling"] is (not on_cpu())
    kw = on.engine_kwargs({"additional_config": key})
    assert kw["async_scheduling"] is True and kw["additional_config"][CPU_ASYNC_KEY]


@pytest.mark.parametrize("bad", [{"budget": 0}, {"budget": 33}, {"window": 0},
                                 {"max_depth": 1}, {"full_batch": 9, "off_batch": 8}, {"min_prob": 2.0},
                                 {"prior": -1.0}, {"batch_cap": "nope"},
                                 {"c_tok_ms": 0.0}, {"history": 0},
                                 {"windw": 3}])
def test_bad_settings_are_rejected(bad):
    with pytest.raises(ValueError):
        DASConfig.of(bad)


def test_default_problem_id_is_stable_and_distinct():
    assert default_problem_id(None, [1, 2, 3]) == default_problem_id(None, (1, 2, 3))
    assert default_problem_id(None, [1, 2, 3]) != default_problem_id(None, [1, 2, 4])
    assert default_problem_id(None, [1, 2, 3]).startswith("prompt:")


def test_server_args_parse_into_a_das_engine():
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from vllm_rl import server_args

    parser = AsyncEngineArgs.add_cli_args(FlexibleArgumentParser())
    args = parser.parse_args(["--model", "m"] + server_args(das={"budget": 2}))
    engine = AsyncEngineArgs.from_cli_args(args)
    assert engine.speculative_config["method"] == "custom_class"
    assert engine.speculative_config["num_speculative_tokens"] == 4
    assert engine.additional_config[CONFIG_KEY]["budget"] == 2
    assert engine.async_scheduling is False
    assert engine.worker_extension_cls == "vllm_rl.worker.RLWorkerExtension"
    assert json.loads(json.dumps(engine.additional_config))   # plain JSON travels


def test_das_flags_are_refused_by_an_engine_without_the_drafter_or_above_its_budget():
    """What the server answers with a 400 before any response (``vllm_rl.http_flags``):
    DAS flags on an engine started without the drafter name ``das``; a budget above the
    engine's b names ``das.budget``; flags without DAS pass through unchanged."""
    from types import SimpleNamespace

    from vllm_rl.das.config import check_engine
    from vllm_rl.flags import FlagError, read

    stock = SimpleNamespace(speculative_config=None, additional_config={})
    das = SimpleNamespace(speculative_config=SimpleNamespace(
        method="custom_class", model=PROPOSER, num_speculative_tokens=8),
        additional_config={CONFIG_KEY: {"budget": 4}})
    with pytest.raises(FlagError) as e:
        check_engine(read({"vllm_rl": {"das": {"budget": 2}}}), stock)
    assert e.value.flag == "das"
    with pytest.raises(FlagError) as e:
        check_engine(read({"vllm_rl": {"das": {"budget": 5}}}), das)
    assert e.value.flag == "das.budget"
    assert check_engine(read({"vllm_rl": {"das": {"budget": 4}}}), das).das.policy == "fixed"
    plain = read({"vllm_rl": {"group": {"size": 2}}})
    assert check_engine(plain, stock) is plain
