"""Partial rollouts that never lose a sample, on the real engine: the timings a trainer at
scale meets (``vllm_rl.integrations.common.partial``, ``vllm_rl.engine.steps``).

Each test drives the drop-ins' own carry buffer (:class:`CarryBuffer`: ``launch``,
``finish``) against an in-process engine stepped by hand (``LLMEngine.add_request`` /
``step``), with one sequence at a time (``max_num_seqs=1``), so a request queues behind
another exactly as a continuation does behind a full batch at 1,024 × 8: every timing
here is an order of engine steps, never a clock.
"""
from __future__ import annotations

import pytest
from vllm import SamplingParams

from conftest import MAX_MODEL_LEN, inproc_engine, shutdown
from vllm_rl.engine.trace import engine_scheduler
from vllm_rl.flags import FlagError
from vllm_rl.integrations.common.partial import CarryBuffer, PartialConfig, end_step
from vllm_rl.outcome import Reason
from vllm_rl.weights import weight_sync

pytestmark = pytest.mark.engine

TOKENS = 40                  # each sample's max_tokens (ignore_eos: it runs to them)


@pytest.fixture(scope="module")
def one_seq_llm():
    """The RL engine in this process, one sequence at a time."""
    llm = inproc_engine(max_num_seqs=1)
    yield llm
    shutdown(llm)


def _ids(seed: int, n: int = 24) -> list[int]:
    return [3 + (seed * 7919 + 31 * i) % 40 for i in range(n)]


def _params(n: int = 1, seed: int = 0, max_tokens: int = TOKENS) -> SamplingParams:
    from vllm_rl import rl_params

    return SamplingParams(n=n, temperature=1.0, seed=seed, max_tokens=max_tokens,
                          ignore_eos=True, logprobs=0,
                          extra_args=rl_params(group={"size": n}))


class Driver:
    """One trainer's steps on the engine, by hand: a launched step's requests added in
    order, the engine stepped, each request's final output kept by its id."""

    def __init__(self, llm) -> None:
        self.llm, self.engine = llm, llm.llm_engine
        self.sched = engine_scheduler(llm)
        self.buffer = CarryBuffer()
        self.count = 0
        self.finals: dict[str, object] = {}

    def launch(self, step: int, prompts: list, params: list, over: float = 1.0,
               max_tokens: int = TOKENS):
        launched = self.buffer.launch(PartialConfig(over=over), step, prompts, params,
                                      max_tokens, 1.0)
        ids = []
        for prompt, sp in zip(launched.prompts, launched.params):
            self.count += 1
            ids.append(f"step{step}-{self.count}")
            self.engine.add_request(ids[-1], prompt, sp)
        return launched, ids

    def step(self, times: int = 1) -> None:
        for _ in range(times):
            for out in self.engine.step():
                if out.finished:
                    self.finals[out.request_id] = out

    def until_done(self, ids: list[str]) -> list:
        while not all(i in self.finals for i in ids):
            assert self.engine.has_unfinished_requests(), [i for i in ids if i not in self.finals]
            self.step()
        return [self.finals.pop(i) for i in ids]

    def finish(self, launched, ids: list[str]) -> list:
        return self.buffer.finish(launched, self.until_done(ids))

    def live(self, rid: str):
        (inner,) = [r for k, r in self.sched.requests.items() if k.startswith(rid)]
        return inner

    def assert_empty(self) -> None:
        sched = self.sched
        assert not sched.requests and not sched.rl_members and not sched.rl_steps
        pool = sched.kv_cache_manager.block_pool
        assert pool.get_num_free_blocks() == pool.num_gpu_blocks - 1   # every block back


@pytest.mark.parametrize("sync", ["none", "between_steps", "while_queued", "both"])
def test_a_continuation_queued_when_its_step_ends_goes_back(one_seq_llm, sync):
    """Step 0 carries a sample after a few tokens; in step 1 its continuation is still
    queued behind another request when the step ends (before and after a weight sync):
    it comes back ``carried`` with no new token, and its record goes back as the next
    continuation, refused by nothing; step 2 finishes it, whole, every token's weights
    in its spans."""
    d = Driver(one_seq_llm)
    first = d.sched.rl_weight_version
    launched, ids = d.launch(0, [{"prompt_token_ids": _ids(1)}], [_params(seed=1)])
    d.step(5)
    assert end_step(one_seq_llm, 0) == 1
    assert d.finish(launched, ids) == [] and d.buffer.samples() == 1
    (part,) = d.buffer.groups[0].carried
    k = len(part.token_ids)
    assert part.info.reason is Reason.CARRIED and 5 <= k < TOKENS
    if sync in ("between_steps", "both"):
        weight_sync(one_seq_llm)
    d.engine.add_request("blocker", {"prompt_token_ids": _ids(9)},
                         SamplingParams(max_tokens=400, ignore_eos=True))
    d.step()                                      # the blocker holds the one sequence
    launched, ids = d.launch(1, [{"prompt_token_ids": _ids(2)}], [_params(seed=2)])
    d.step(2)
    assert d.live(ids[0]).num_output_tokens == 0, "the continuation is queued"
    if sync in ("while_queued", "both"):
        weight_sync(one_seq_llm)
    assert end_step(one_seq_llm, 1) == 2
    assert d.finish(launched, ids) == []
    again = {g.start_step: g.carried[0] for g in d.buffer.groups}
    assert again[0].token_ids == part.token_ids, "no token made, none lost"
    info = again[0].info
    assert (info.reason, info.length, info.prior_tokens) == (Reason.CARRIED, k, k)
    assert info.weight_versions is None and info.weight_version == first
    assert (again[1].info.length, again[1].info.weight_versions) == (0, None)
    d.engine.abort_request(["blocker"])
    launched, ids = d.launch(2, [], [])            # every carried sample goes back
    complete = d.finish(launched, ids)
    now = d.sched.rl_weight_version
    assert len(complete) == 2 and len(d.buffer) == 0
    for g in complete:
        (whole,) = g.ended
        info = whole.info
        assert info.reason is Reason.LENGTH and info.length == TOKENS == len(whole.token_ids)
        assert info.step == 2 and info.steps_crossed == 2 - g.start_step
        if g.start_step == 0:
            assert whole.token_ids[:k] == part.token_ids
            spans = [[first, 0]] + ([[now, k]] if now != first else [])
            assert (info.weight_versions or [[info.weight_version, 0]]) == spans
        else:
            assert info.weight_version == now and info.weight_versions is None
    d.assert_empty()


def test_end_step_on_unknown_ended_and_aborted_steps(one_seq_llm):
    """``end_step`` for a step the engine does not hold answers 0; for a step already
    ended, its samples still live; client aborts of the step's requests between the
    calls and the engine's next step leave them out.  Every sample comes back once
    (carried; an aborted one as vLLM ends a client's abort), and nothing is left in the
    engine.  A bad step is refused at
    the caller and in the engine core alike, never coerced."""
    d = Driver(one_seq_llm)
    assert end_step(one_seq_llm, 987) == 0
    launched, ids = d.launch(7, [{"prompt_token_ids": _ids(20 + i)} for i in range(4)],
                             [_params(seed=20 + i) for i in range(4)], over=1.0)
    d.step(3)
    d.engine.abort_request([ids[3]])                   # aborted before the step ends
    assert end_step(one_seq_llm, 7) == 3
    assert end_step(one_seq_llm, 7) == 3, "ended already: still live until the next step"
    d.engine.abort_request([ids[2]])                   # aborted after it ended
    outs = d.until_done(ids[:2])
    assert [o.outputs[0].rollout_info.reason for o in outs] == [Reason.CARRIED] * 2
    assert not d.engine.has_unfinished_requests() and not set(ids[2:]) & set(d.finals)
    assert end_step(one_seq_llm, 7) == 0, "the step is forgotten once none is live"
    d.assert_empty()
    for bad in (1.5, True, "7", None, -1):
        with pytest.raises(FlagError, match="partial.step"):
            end_step(one_seq_llm, bad)
        with pytest.raises(FlagError, match="partial.step"):
            d.sched.rl_end_step(bad)


def test_a_continuation_at_the_models_limit(one_seq_llm):
    """A sample carried one token short of ``max_model_len`` (the engine ends it
    ``length`` at the limit itself, so no carried sample reaches it) goes back as a
    continuation whose prompt and prior tokens fill the model but one: it makes that
    token and ends ``length``, its record the whole sample's."""
    d = Driver(one_seq_llm)
    room = 10
    prompt = _ids(30, MAX_MODEL_LEN - room)
    launched, ids = d.launch(3, [{"prompt_token_ids": prompt}], [_params(seed=3, max_tokens=64)],
                             max_tokens=64)
    d.step(room - 2)                               # room - 2 tokens; the next ends the step
    assert end_step(one_seq_llm, 3) == 1
    assert d.finish(launched, ids) == []
    (part,) = d.buffer.groups[0].carried
    assert len(prompt) + len(part.token_ids) == MAX_MODEL_LEN - 1
    launched, ids = d.launch(4, [], [], max_tokens=64)
    (sent,) = launched.prompts
    assert len(sent["prompt_token_ids"]) == MAX_MODEL_LEN - 1
    (g,) = d.finish(launched, ids)
    (whole,) = g.ended
    assert whole.info.reason is Reason.LENGTH and whole.info.length == room
    assert len(whole.token_ids) == room and whole.info.prior_tokens == room - 1
    d.assert_empty()


def _valid_spans(info) -> bool:
    spans = info.weight_versions or [[info.weight_version, 0]]
    starts = [i for _, i in spans]
    return starts[0] == 0 and all(a < b for a, b in zip(starts, starts[1:])) and (
        info.length == 0 or starts[-1] < info.length)


async def _final(engine, rid: str, prompt, sp, started) -> object:
    """A request streamed from ``AsyncLLM`` (``started`` set at its first token), its
    samples' last outputs gathered as the offline API returns them."""
    from types import SimpleNamespace

    last: dict[int, object] = {}
    prompt_ids = None
    async for out in engine.generate(prompt, sp, request_id=rid):
        prompt_ids = out.prompt_token_ids
        for c in out.outputs:
            last[c.index] = c
            if c.token_ids:
                started.set()
    return SimpleNamespace(prompt_token_ids=prompt_ids, outputs=[last[i] for i in sorted(last)])


async def _reloads() -> dict:
    """For each mode, on one engine: step 0 carries one group (three sequences at a
    time: one of its samples has tokens, the other none); step 1 sends its
    continuations beside a new group (one of the four requests queues), and new weights
    come in that mode once it generates; then every carried sample goes back until none
    is left."""
    import asyncio

    from transformers import AutoModelForCausalLM
    from vllm.v1.engine.async_llm import AsyncLLM

    from vllm_rl import engine_args
    from vllm_rl.task import MODEL_PATH
    from vllm_rl.weights import load_weights_async

    engine = AsyncLLM.from_engine_args(engine_args(MODEL_PATH, seed=0,
                                                   max_model_len=MAX_MODEL_LEN, max_num_seqs=3))
    weights = AutoModelForCausalLM.from_pretrained(MODEL_PATH).state_dict()
    count, results = 0, {}
    try:
        for mode in ("wait", "keep"):
            buffer, seen = CarryBuffer(), {"steps": []}

            async def run(step, prompts, params, over, reload=False):
                nonlocal count
                launched = buffer.launch(PartialConfig(over=over), step, prompts, params,
                                         LONG, 1.0)
                started, tasks = asyncio.Event(), []
                for prompt, sp in zip(launched.prompts, launched.params):
                    count += 1
                    tasks.append(asyncio.create_task(
                        _final(engine, f"{mode}-{count}", prompt, sp, started)))
                report = None
                if reload:
                    await started.wait()                  # the step is generating
                    report = await load_weights_async(engine, weights, mode=mode)
                outs = await asyncio.gather(*tasks)
                complete = buffer.finish(launched, outs)
                seen["steps"].append({"step": step, "report": report, "complete": [
                    [p.info for p in g.ended] for g in complete]})

            short, long = _params(n=2, seed=1, max_tokens=8), _params(n=2, seed=2,
                                                                       max_tokens=LONG)
            await run(0, [{"prompt_token_ids": _ids(40)}, {"prompt_token_ids": _ids(41)}],
                      [short, long], over=2.0)
            seen["carried_after_0"] = buffer.samples()
            await run(1, [{"prompt_token_ids": _ids(42)}], [_params(n=2, seed=3, max_tokens=LONG)],
                      over=2.0, reload=True)
            step = 2
            while len(buffer):                            # every carried sample goes back
                await run(step, [], [], over=1.0)
                step += 1
            seen["unfinished"] = engine.output_processor.get_num_unfinished_requests()
            results[mode] = seen
    finally:
        engine.shutdown()
    return results


LONG = 120


@pytest.fixture(scope="module")
def reloads() -> dict:
    import asyncio

    return asyncio.run(_reloads())


@pytest.mark.parametrize("mode", ["wait", "keep"])
def test_a_reload_while_carried_samples_wait_in_wait_and_keep_modes(reloads, mode):
    """New weights (``load_weights_async``) while a step runs, its continuations beside
    new prompts, with samples carried before it: in ``wait`` mode the requests in flight
    finish on the old weights, in ``keep`` mode they go on with the new ones (their
    records say where).  Three sequences at a time, so a request queues.  Every
    record's spans hold a token each, every carried sample goes back, refused by
    nothing, and the three groups' six samples end exactly once."""
    seen = reloads[mode]
    assert seen["carried_after_0"] == 2 and seen["unfinished"] == 0
    infos = [i for s in seen["steps"] for g in s["complete"] for i in g]
    assert len(infos) == 6 and all(len(g) == 2 for s in seen["steps"] for g in s["complete"])
    assert all(_valid_spans(i) for i in infos), infos
    assert all(i.reason is Reason.LENGTH for i in infos)
    version = seen["steps"][1]["report"]["weight_version"]
    crossed = [i for i in infos if i.weight_versions and [version, i.weight_versions[-1][1]]
               == i.weight_versions[-1] and i.weight_versions[-1][1] > (i.prior_tokens or 0)]
    if mode == "keep":
        assert crossed, "a sample in flight went on with the new weights mid-part"
    else:
        assert not crossed, "in wait mode no part runs across the reload"


def _storm(llm, seed: int, steps: int) -> tuple[dict, list[str]]:
    """Trainer steps of new groups (n of 1, 2 or 4, some at the model's limit) and
    continuations through the drop-ins' carry buffer, and between engine steps, at
    random: the drop-in ends the step, new weights come in ``wait`` / ``keep`` /
    ``abort`` mode, a client aborts a request, the trainer restarts from the buffer's
    JSON (between steps, or in the middle of one, its requests left as orphans), bad
    launches and bad steps.  Returns what happened and every broken invariant."""
    import json
    import random

    from vllm.sampling_params import RequestOutputKind

    from vllm_rl import rl_params
    from vllm_rl.flags import read

    rng = random.Random(seed)
    engine = llm.llm_engine
    buffer, trained, problems, count = CarryBuffer(), set(), [], 0
    stats = dict.fromkeys(("carried", "syncs", "aborts", "restarts", "refused", "groups"), 0)

    def state():
        return json.dumps(buffer.state_dict())

    def restart():
        nonlocal buffer
        kept = json.loads(state())
        buffer = CarryBuffer()
        buffer.load_state_dict(kept)
        stats["restarts"] += 1

    def check_group(g):
        if g.group_id in trained:
            problems.append(f"group {g.group_id} trained twice")
        trained.add(g.group_id)
        stats["groups"] += 1
        if len(g.ended) != g.redundant:
            problems.append(f"group {g.group_id}: {len(g.ended)} of {g.redundant} samples")
        for p in g.ended:
            if len(p.logprobs) != len(p.token_ids) or not _valid_spans(p.info) or (
                    p.info.reason is not Reason.STALE and p.info.length != len(p.token_ids)):
                problems.append(f"group {g.group_id}: a broken sample {p.info}")

    for step in range(steps):
        prompts, params = [], []
        for i in range(rng.randint(0, 3)):
            n = rng.choice([1, 2, 4])
            size = rng.choice([8, 24, MAX_MODEL_LEN - 30])
            prompts.append({"prompt_token_ids": _ids(1000 * seed + 10 * step + i, size)})
            params.append(SamplingParams(
                n=n, temperature=1.0, seed=rng.randint(0, 10**6), logprobs=0,
                max_tokens=rng.choice([4, 16, 60]), ignore_eos=rng.random() < 0.5,
                top_p=rng.choice([1.0, 0.9]), extra_args=rl_params(group={"size": n})))
        cfg = PartialConfig(over=rng.choice([1.0, 2.0, 4.0]),
                            max_staleness=rng.choice([None, None, 2]))
        before = state()
        with pytest.raises(ValueError):
            buffer.launch(cfg, step, [{"prompt_token_ids": [5]}],
                          [SamplingParams(extra_args={"vllm_rl": "not a mapping"})], 60, 1.0)
        with pytest.raises(FlagError):
            end_step(llm, rng.choice([1.5, True, "x", None, -3]))
        stats["refused"] += 2
        if state() != before:
            problems.append("a refused launch changed the buffer")
        launched = buffer.launch(cfg, step, prompts, params, 60, 1.0)
        rids, finals, aborted, orphaned = [], {}, set(), False
        for prompt, sp in zip(launched.prompts, launched.params):
            read(sp.extra_args, n=sp.n)                # every continuation reads back
            sp.output_kind = RequestOutputKind.FINAL_ONLY      # as LLM.generate sends it
            count += 1
            rids.append(f"storm{seed}-{count}")
            engine.add_request(rids[-1], prompt, sp)

        def live():
            return [r for r in rids if r not in finals and r not in aborted]

        def step_once():
            for out in engine.step():
                if out.finished and out.request_id in rids:
                    finals[out.request_id] = out

        while live():
            u = rng.random()
            if u < 0.04:                               # new weights, in some mode
                mode = rng.choice(["wait", "keep", "abort"])
                if mode == "abort":
                    aborted |= set(live())
                    engine.abort_request(live())
                while mode == "wait" and engine.has_unfinished_requests():
                    step_once()
                weight_sync(llm)
                stats["syncs"] += 1
            elif u < 0.06:                             # a client aborts one request
                r = rng.choice(live())
                engine.abort_request([r])
                aborted.add(r)
            elif u < 0.10:                             # the drop-in ends the step
                end_step(llm, step)
            elif u < 0.105 and step:                   # the trainer dies mid-step
                orphaned = True
                break
            if live():
                step_once()
        stats["aborts"] += len(aborted)
        if orphaned or aborted:
            # the step fails (a restart, or outputs the drop-in never got): the buffer
            # is as it was, and its requests are orphans the engine ends
            if aborted and not orphaned:
                before = state()
                with pytest.raises(ValueError):
                    buffer.finish(launched, [finals[r] for r in rids if r in finals])
                if state() != before:
                    problems.append("a failed finish changed the buffer")
            engine.abort_request(live())
            while engine.has_unfinished_requests():
                engine.step()
            restart()
            continue
        outs = [finals[r] for r in rids]
        stats["carried"] += sum(c.rollout_info.reason is Reason.CARRIED
                                for o in outs for c in o.outputs)
        for g in buffer.finish(launched, outs):
            check_group(g)
        if rng.random() < 0.2:
            restart()                                  # between steps
    for step in range(steps, steps + 10):              # every carried sample goes back
        if not len(buffer):
            break
        launched = buffer.launch(PartialConfig(over=1.0), step, [], [], 60, 1.0)
        for g in buffer.finish(launched, llm.generate(launched.prompts, launched.params,
                                                      use_tqdm=False)):
            check_group(g)
    if len(buffer):
        problems.append("the buffer never drained")
    return stats, problems


def test_a_storm_of_carried_samples(one_seq_llm):
    """Every invariant of the carry holds through :func:`_storm`: no sample lost or
    trained twice, every record whole with spans that hold a token, every continuation
    read back by the flag reader, a refused launch or a failed step leaving the buffer
    as it was, and nothing left in the engine."""
    stats, problems = _storm(one_seq_llm, seed=1, steps=16)
    assert not problems, problems
    assert stats["carried"] and stats["syncs"] and stats["aborts"] and stats["restarts"], stats
    Driver(one_seq_llm).assert_empty()
