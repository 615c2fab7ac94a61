"""The AsyncLLM way in (``vllm_rl.engine_args``): groups, records, bad flags at submission,
and ARRoL's head updated through ``collective_rpc``, the hidden states the records name
taken with ``arrol_hidden``."""
import asyncio

import pytest
from vllm import SamplingParams
from vllm.sampling_params import RequestOutputKind

from conftest import MAX_MODEL_LEN
from vllm_rl import Reason, RolloutInfo, engine_args, rl_params
from vllm_rl.outcome import record_of

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


async def _streamed(engine, request_id, prompt, params, started: asyncio.Event):
    """A request with cumulative outputs (``params`` may say FINAL_ONLY: replaced):
    ``started`` is set at its first output (it is in the engine core and has produced
    a token); returns its final completions, by index."""
    params = params.clone()
    params.output_kind = RequestOutputKind.CUMULATIVE
    final = {}
    async for out in engine.generate(prompt, params, request_id=request_id):
        for c in out.outputs:
            final[c.index] = c
        started.set()
    return [final[i] for i in sorted(final)]


async def _until_started(task: asyncio.Task, started: asyncio.Event,
                         deadline_s: float = 300) -> None:
    """Until ``started`` is set by ``task`` (:func:`_streamed`); fails if the task ended
    first (with its own error, if any), or past the deadline (only a safety net)."""
    waiter = asyncio.ensure_future(started.wait())
    try:
        await asyncio.wait({task, waiter}, timeout=deadline_s,
                           return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
    if not started.is_set():
        if task.done():
            task.result()
            raise AssertionError("the request ended before any output")
        raise AssertionError(f"no output within {deadline_s} s")


async def _drain(queue):
    """The final output of a request added with ``AsyncLLM.add_request``."""
    while True:
        out = queue.get_nowait() or await queue.get()
        if out.finished:
            return out


async def _scenario(prompts):
    from vllm.v1.engine.async_llm import AsyncLLM

    from vllm_rl.arrol.config import v1_runner_env
    from vllm_rl.task import MODEL_PATH

    with v1_runner_env():     # engine_args(arrol=...) sets it for the process; scope it here
        engine = AsyncLLM.from_engine_args(engine_args(MODEL_PATH, seed=0,
                                                       max_model_len=MAX_MODEL_LEN, arrol=True))
    try:
        running = asyncio.Event()
        valid = asyncio.create_task(_streamed(engine, "valid", prompts[0], SamplingParams(
            n=8, temperature=1.0, max_tokens=256, seed=1,
            extra_args=rl_params(group={"size": 4}, darts={"mode": "shortest"})), running))
        await _until_started(valid, running)   # a group generates while the bad ones come
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
        from vllm_rl.arrol.hidden import hidden_from_wire
        from vllm_rl.outcome import hidden_ids, with_hidden

        scored = [record_of(c) for c in arrol.outputs]
        scored = [i for i in scored if i is not None and i.score is not None]
        kept = hidden_from_wire(
            (await engine.collective_rpc("arrol_hidden", args=(hidden_ids(scored),)))[0])
        arrol = (arrol, with_hidden(scored, kept))
        reload = await _reload_while_serving(engine, prompts)
        return errors, out, after, (version, arrol, hidden_size), reload
    finally:
        engine.shutdown()


FLIGHT_TOKENS = 256


async def _reload_while_serving(engine, prompts):
    """New weights while requests are in flight: "wait" lets them finish on the old
    weights, "abort" ends them with the reason abort; the RL state stays.  A request sent
    while the engine is paused for the reload (hooked in at the reload RPC itself) is
    parked, not refused, and then runs on the new weights (vLLM 0.33's own
    pause_generation would answer it with a retryable error, HTTP 503).

    Ordered on the engine, never on the clock: each reload starts once every request in
    flight has produced its first token (ignore_eos: FLIGHT_TOKENS - 1 steps still to
    go); the arrival is added before the reload RPC is sent, so the engine core (one
    input queue, in order) holds it while paused, and nothing of it may come back
    before the resume."""
    from transformers import AutoModelForCausalLM

    from vllm_rl.task import MODEL_PATH
    from vllm_rl.weights import load_weights_async

    initial = AutoModelForCausalLM.from_pretrained(MODEL_PATH).state_dict()
    halved = {k: v * 0.5 if "mlp" in k else v for k, v in initial.items()}
    greedy = SamplingParams(temperature=0, max_tokens=24)
    group = SamplingParams(n=8, temperature=1.0, max_tokens=FLIGHT_TOKENS, seed=5,
                           ignore_eos=True,
                           extra_args=rl_params(group={"size": 4}, darts={"mode": "shortest"}))
    head = (await engine.collective_rpc("arrol_info"))[0]["version"]
    before = await _collect(engine, "g0", prompts[4], greedy)
    ended, arrived = {}, {}
    rpc = engine.collective_rpc

    async def rpc_with_an_arrival(method, *args, **kwargs):
        if method != "vllm_rl_reload_weights":
            return await rpc(method, *args, **kwargs)
        # paused: a client sends a request now.  add_request returns once it is on its
        # way to the engine core, ahead of the reload RPC on the same channel
        queue = await engine.add_request(f"arrive-{mode}", prompts[4], greedy)
        result = await rpc(method, *args, **kwargs)
        arrived[mode] = (queue, queue.output is not None)    # still paused: nothing yet
        return result

    engine.collective_rpc = rpc_with_an_arrival
    try:
        for mode, weights in (("wait", halved), ("abort", initial)):
            started = [asyncio.Event() for _ in range(3)]
            flight = [asyncio.create_task(_streamed(engine, f"{mode}-{i}", prompts[5 + i],
                                                    group, started[i]))
                      for i in range(3)]
            for task, event in zip(flight, started):
                await _until_started(task, event)
            await load_weights_async(engine, weights, mode=mode)
            ended[mode] = await asyncio.gather(*flight)
            queue, served_while_paused = arrived[mode]
            ended[f"{mode}-arrived"] = (await asyncio.wait_for(_drain(queue), 300),
                                        served_while_paused)
            ended[f"{mode}-greedy"] = await _collect(engine, f"g-{mode}", prompts[4], greedy)
    finally:
        del engine.collective_rpc
    return before, ended, head, (await engine.collective_rpc("arrol_info"))[0]["version"]


def test_async_engine_serves_groups_and_rejects_bad_flags(prompts):
    errors, out, after, (version, arrol, hidden_size), reload = asyncio.run(
        asyncio.wait_for(_scenario(prompts), 1800))        # the deadline: a safety net
    assert set(errors) == set(BAD_FLAGS)
    for flag, err in errors.items():
        assert type(err).__name__ == "VLLMValidationError"
        assert f"'{flag}'" in str(err) and "allowed" in str(err)
    infos = [record_of(c) for c in out]
    assert len(infos) == 8 and all(i is not None for i in infos)
    valid = [i for i in infos if i.valid]
    if any(i.reason is Reason.DARTS_CANCELLED for i in infos):
        assert len(valid) == 4
    assert after.finished and after.outputs[0].token_ids
    arrol, scored = arrol
    assert scored and all(i.head_version == version and i.p == 0.5 for i in scored)
    assert all(i.hidden_state().shape == (hidden_size,) for i in scored)

    before, ended, head, head_after = reload
    assert head_after == head, "the ARRoL head survives weight reloads"
    assert ended["wait-greedy"].outputs[0].text != before.outputs[0].text   # new weights
    assert ended["abort-greedy"].outputs[0].text == before.outputs[0].text  # restored
    for mode in ("wait", "abort"):             # sent during the reload: parked, then new weights
        out, served_while_paused = ended[f"{mode}-arrived"]
        assert not served_while_paused and out.finished
        assert out.outputs[0].finish_reason in ("length", "stop")      # not refused, not aborted
        assert out.outputs[0].text == ended[f"{mode}-greedy"].outputs[0].text
    for completions in ended["wait"]:              # finished on the old weights, whole
        assert len(completions) == 8
        for c in completions:
            info = record_of(c)
            assert info.reason is not Reason.ABORT and c.finish_reason != "abort", info
            assert len(c.token_ids) == info.length == FLIGHT_TOKENS, info
    for completions in ended["abort"]:             # every sample in flight ended now, and said so
        assert len(completions) == 8
        for c in completions:
            info = RolloutInfo.from_completion(c)
            assert (c.finish_reason, info.reason) == ("abort", Reason.ABORT), info
            assert len(c.token_ids) == info.length < FLIGHT_TOKENS, info
