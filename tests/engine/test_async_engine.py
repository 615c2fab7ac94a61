"""The AsyncLLM way in (``vllm_rl.engine_args``): groups, records, bad flags at submission,
and ARRoL's head updated through ``collective_rpc`` with hidden states in the records."""
import asyncio

import pytest
from vllm import SamplingParams
from vllm.sampling_params import RequestOutputKind

from conftest import MAX_MODEL_LEN
from vllm_rl import Reason, RolloutInfo, engine_args, rl_params

pytestmark = pytest.mark.engine

BAD_FLAGS = {
    "darts.mode": {"vllm_rl": {"darts": {"mode": "longest"}}},
    "group.size": {"vllm_rl": {"group": {"size": -1}}},
    "group.redundant": {"vllm_rl": {"group": {"size": 8}}},          # M' = n = 2 < M
    "darts.unknown": {"vllm_rl": {"darts": {"unknown": 1}}},
    "vllm_rl": {"vllm_rl": "{broken json"},
    "duet.pattern": {"vllm_rl": {"duet": {"pattern": "(a)\\1"}}},           # backreference: not RE2
    "arrol.kappa": {"vllm_rl": {"arrol": {"kappa": -0.1}}},
}
FLAT_CALIBRATION = {"pos": [0] * 128, "neg": [0] * 128, "alpha": 1.0, "prior": 0.5,
                    "delta": 0.0, "bins": 128}             # q = 0.5 everywhere: p = 0.5


async def _collect(engine, request_id, prompt, params):
    final = None
    async for out in engine.generate(prompt, params, request_id=request_id):
        final = out
    return final


async def _scenario(prompts):
    from vllm.v1.engine.async_llm import AsyncLLM

    from vllm_rl.arrol.config import v1_runner_env

    with v1_runner_env():     # engine_args(arrol=...) sets it for the process; scope it here
        engine = AsyncLLM.from_engine_args(engine_args(seed=0, max_model_len=MAX_MODEL_LEN,
                                                       arrol=True))
    try:
        valid = asyncio.create_task(_collect(engine, "valid", prompts[0], SamplingParams(
            n=8, temperature=1.0, max_tokens=256, seed=1, output_kind=RequestOutputKind.FINAL_ONLY,
            extra_args=rl_params(group={"size": 4}, darts={"mode": "shortest"}))))
        await asyncio.sleep(0.05)
        errors = {}
        for flag, extra in BAD_FLAGS.items():
            try:
                await _collect(engine, f"bad-{flag}", prompts[1],
                               SamplingParams(n=2, max_tokens=8, extra_args=extra))
            except Exception as e:  # noqa: BLE001 - the error is what the test inspects
                errors[flag] = e
        out = await valid
        after = await _collect(engine, "after", prompts[2], SamplingParams(max_tokens=16, seed=2))
        version = (await engine.collective_rpc(
            "arrol_update", args=(None, FLAT_CALIBRATION, False, None)))[0]
        arrol = await _collect(engine, "arrol", prompts[3], SamplingParams(
            n=4, temperature=1.0, max_tokens=48, seed=3, output_kind=RequestOutputKind.FINAL_ONLY,
            extra_args=rl_params(arrol={"l_detect": 8, "return_hidden": True})))
        hidden_size = (await engine.collective_rpc("arrol_info"))[0]["hidden_size"]
        reload = await _reload_while_serving(engine, prompts)
        return errors, out, after, (version, arrol, hidden_size), reload
    finally:
        engine.shutdown()


async def _reload_while_serving(engine, prompts):
    """New weights while requests are in flight: "wait" lets them finish on the old
    weights, "abort" ends them with the reason abort; the RL state stays.  A request sent
    while the engine is paused for the reload (hooked in at the reload RPC itself) is
    parked, not refused, and then runs on the new weights (vLLM 0.33's own
    pause_generation would answer it with a retryable error, HTTP 503)."""
    from transformers import AutoModelForCausalLM

    from vllm_rl.task import MODEL_PATH
    from vllm_rl.weights import load_weights_async

    initial = AutoModelForCausalLM.from_pretrained(MODEL_PATH).state_dict()
    halved = {k: v * 0.5 if "mlp" in k else v for k, v in initial.items()}
    greedy = SamplingParams(temperature=0, max_tokens=24)
    group = SamplingParams(n=8, temperature=1.0, max_tokens=256, seed=5,
                           output_kind=RequestOutputKind.FINAL_ONLY,
                           extra_args=rl_params(group={"size": 4}, darts={"mode": "shortest"}))
    head = (await engine.collective_rpc("arrol_info"))[0]["version"]
    before = await _collect(engine, "g0", prompts[4], greedy)
    ended, arrived = {}, {}
    rpc = engine.collective_rpc

    async def rpc_with_an_arrival(method, *args, **kwargs):
        if method == "vllm_rl_reload_weights":      # paused: a client sends a request now
            task = asyncio.create_task(_collect(engine, f"arrive-{mode}", prompts[4], greedy))
            await asyncio.sleep(0.2)                # its request reaches the engine core
            arrived[mode] = (task, task.done())     # parked: cannot finish before resume
        return await rpc(method, *args, **kwargs)

    engine.collective_rpc = rpc_with_an_arrival
    try:
        for mode, weights in (("wait", halved), ("abort", initial)):
            flight = [asyncio.create_task(_collect(engine, f"{mode}-{i}", prompts[5 + i], group))
                      for i in range(3)]
            await asyncio.sleep(0.3)
            await load_weights_async(engine, weights, mode=mode)
            ended[mode] = [o for o in await asyncio.gather(*flight)]
            task, done_while_paused = arrived[mode]
            ended[f"{mode}-arrived"] = (await task, done_while_paused)
            ended[f"{mode}-greedy"] = await _collect(engine, f"g-{mode}", prompts[4], greedy)
    finally:
        del engine.collective_rpc
    return before, ended, head, (await engine.collective_rpc("arrol_info"))[0]["version"]


def test_async_engine_serves_groups_and_rejects_bad_flags(prompts):
    errors, out, after, (version, arrol, hidden_size), reload = asyncio.run(_scenario(prompts))
    assert set(errors) == set(BAD_FLAGS)
    for flag, err in errors.items():
        assert type(err).__name__ == "VLLMValidationError"
        assert f"'{flag}'" in str(err) and "allowed" in str(err)
    infos = [RolloutInfo.decode(c.stop_reason) for c in out.outputs]
    assert len(infos) == 8 and all(i is not None for i in infos)
    valid = [i for i in infos if i.valid]
    if any(i.reason is Reason.DARTS_CANCELLED for i in infos):
        assert len(valid) == 4
    assert after.finished and after.outputs[0].token_ids
    scored = [RolloutInfo.decode(c.stop_reason) for c in arrol.outputs]
    scored = [i for i in scored if i is not None and i.score is not None]
    assert scored and all(i.head_version == version and i.p == 0.5 for i in scored)
    assert all(i.hidden_state().shape == (hidden_size,) for i in scored)

    before, ended, head, head_after = reload
    assert head_after == head, "the ARRoL head survives weight reloads"
    assert ended["wait-greedy"].outputs[0].text != before.outputs[0].text   # new weights
    assert ended["abort-greedy"].outputs[0].text == before.outputs[0].text  # restored
    for mode in ("wait", "abort"):             # sent during the reload: parked, then new weights
        out, done_while_paused = ended[f"{mode}-arrived"]
        assert not done_while_paused and out.finished
        assert out.outputs[0].finish_reason in ("length", "stop")      # not refused, not aborted
        assert out.outputs[0].text == ended[f"{mode}-greedy"].outputs[0].text
    for out in ended["wait"]:                      # finished on the old weights, whole
        infos = [RolloutInfo.decode(c.stop_reason) for c in out.outputs]
        assert all(i.reason is not Reason.ABORT for i in infos)
    reasons = {(c.finish_reason, RolloutInfo.from_completion(c).reason)
               for out in ended["abort"] for c in out.outputs}
    assert ("abort", Reason.ABORT) in reasons, reasons     # ended now, and said so
    for finish, reason in reasons:
        if reason is Reason.ABORT:
            assert finish == "abort"
