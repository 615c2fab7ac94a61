"""vllm_rl as verl's rollout backend, against the real verl package (pinned by the install).

One real ``RLHttpServer`` actor (verl's vLLM server on the RL engine with the DAS drafter
and the ARRoL head, embedded model) runs in a local Ray cluster on the CPU.  verl's own ``AgentLoopWorker`` runs the
``vllm_rl_agent`` loop → ``LLMServerClient`` → the ``RLRouter`` actor → the server, so the
flags reach the engine the way they do in training, and the records come back in
``extra_fields``.  GPU placement groups and weight sync do not run on the CPU: the server
is created as a standalone actor on no GPU (the one fake here: ``workers=[]``).

The trainer mode runs verl's own ``PPOTrainer.step`` on a real TransferQueue (one
storage unit: TransferQueue's controller and each storage unit are ``num_cpus=1`` Ray
actors, so verl's default of 8 units never schedules on this 2-CPU cluster), filled by
verl's ``AgentLoopWorkerTQ`` from the same server; only what verl builds on GPUs in
``PPOTrainer.init`` is stood in for (test docstring).
"""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from vllm_rl import Reason, RolloutInfo
from vllm_rl.compat import vllm_version_shim
from vllm_rl.integrations.common.policy import StaticPolicy

vllm_version_shim()

N = 4          # M': rollout.n
M = 2          # group.size
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"


def verl_config(*extra: str):
    import verl
    from hydra import compose, initialize_config_dir

    from vllm_rl.task import MODEL_PATH

    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer/config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose(config_name="ppo_trainer", overrides=[
            f"actor_rollout_ref.model.path={MODEL_PATH}",
            f"+actor_rollout_ref.model.custom_chat_template={CHAT_TEMPLATE!r}",
            "actor_rollout_ref.rollout.name=vllm_rl",
            f"actor_rollout_ref.rollout.n={N}",
            "actor_rollout_ref.rollout.load_format=auto",        # the embedded weights
            "actor_rollout_ref.rollout.dtype=float32",
            "actor_rollout_ref.rollout.enforce_eager=true",
            "actor_rollout_ref.rollout.free_cache_engine=false",
            "+actor_rollout_ref.rollout.enable_sleep_mode=false",  # CUDA only
            "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
            "actor_rollout_ref.rollout.max_model_len=512",
            "actor_rollout_ref.rollout.prompt_length=128",
            "actor_rollout_ref.rollout.response_length=256",
            "actor_rollout_ref.rollout.max_num_seqs=64",
            "actor_rollout_ref.rollout.max_num_batched_tokens=2048",
            "actor_rollout_ref.rollout.calculate_log_probs=true",
            "actor_rollout_ref.rollout.agent.default_agent_loop=vllm_rl_agent",
            "actor_rollout_ref.rollout.agent.num_workers=1",
            "+actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_memory_bytes=1073741824",
            "+actor_rollout_ref.rollout.engine_kwargs.vllm_rl.das.batch_cap=linear",
            "+actor_rollout_ref.rollout.engine_kwargs.vllm_rl.arrol=true",
            "+actor_rollout_ref.rollout.engine_kwargs.vllm_rl.flags.arrol.l_detect=16",
            "+actor_rollout_ref.rollout.engine_kwargs.vllm_rl.flags.arrol.return_hidden=true",
            "+actor_rollout_ref.rollout.engine_kwargs.vllm_rl.flags.darts.mode=shortest",
            f"+actor_rollout_ref.rollout.engine_kwargs.vllm_rl.flags.group.size={M}",
            "+actor_rollout_ref.rollout.engine_kwargs.vllm_rl.flags.duet.pattern='\\\\boxed\\{[^}]*\\}'",
            "+actor_rollout_ref.rollout.engine_kwargs.vllm_rl.flags.duet.k1=8",
            "+actor_rollout_ref.rollout.engine_kwargs.vllm_rl.flags.duet.k2=48",
            "+actor_rollout_ref.rollout.engine_kwargs.vllm_rl.flags.duet.grace=8",
            "+actor_rollout_ref.rollout.engine_kwargs.vllm_rl.flags.duet.eps=0.5",
            *extra,
        ])


@pytest.fixture(scope="module")
def verl_cluster():
    """Ray on the CPU with one RLHttpServer actor and the RLRouter in front of it."""
    import ray
    from verl.workers.rollout.replica import RolloutMode
    from verl.workers.rollout.router import get_router_handle

    from vllm_rl.integrations.verl.server import RLHttpServer

    try:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
                 ignore_reinit_error=True)
    except Exception as e:                                     # noqa: BLE001
        pytest.skip(f"Ray cannot start on this machine: {e}")
    config = verl_config()
    rollout = config.actor_rollout_ref.rollout
    server = ray.remote(RLHttpServer).options(name="vllm_rl_server_0_0",
                                              max_concurrency=1000).remote(
        config=rollout, model_config=config.actor_rollout_ref.model,
        rollout_mode=RolloutMode.STANDALONE, workers=[], replica_rank=0, node_rank=0,
        gpus_per_node=1, nnodes=1, cuda_visible_devices="")
    ray.get(server.launch_server.remote(*ray.get(server.get_master_address.remote())))
    address = "{}:{}".format(*ray.get(server.get_server_address.remote()))
    from vllm_rl.integrations.verl import ROUTER_CONFIG

    router = get_router_handle({address: server}, router_config_path=str(ROUTER_CONFIG))
    yield config, server, router
    ray.shutdown()


def run_agent_loop(config, router, prompts: list[str], uids: list[str], indices: list[int],
                   sampling: dict | None = None):
    """verl's AgentLoopWorker.generate_sequences on one batch (each prompt repeated N
    times, as verl's trainer does), through LLMServerClient and the router actor.
    ``sampling``: vLLM sampling parameters added to every request (verl's server keeps
    those a request names)."""
    from verl import DataProto
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
    from verl.workers.rollout.llm_server import LLMServerClient

    client = LLMServerClient(config, router)
    if sampling:
        generate = client.generate

        async def generate_with(request_id, *, sampling_params, **kwargs):
            return await generate(request_id, sampling_params={**sampling_params, **sampling},
                                  **kwargs)

        client.generate = generate_with
    worker = AgentLoopWorker(config, client)
    rows = [(p, u, i) for p, u, i in zip(prompts, uids, indices) for _ in range(N)]
    batch = DataProto.from_dict(non_tensors={
        "raw_prompt": np.array([[{"role": "user", "content": p}] for p, _, _ in rows],
                               dtype=object),
        "uid": np.array([u for _, u, _ in rows], dtype=object),
        "index": np.array([i for _, _, i in rows], dtype=object),
        "data_source": np.array(["arith"] * len(rows), dtype=object),
    })
    return asyncio.run(worker.generate_sequences(batch))


@pytest.fixture(scope="module")
def rollout_batch(verl_cluster):
    from vllm_rl.task import heldout_prompts

    config, _, router = verl_cluster
    prompts = heldout_prompts(6)
    out = run_agent_loop(config, router, prompts, [f"uid-{i}" for i in range(6)], list(range(6)))
    return out


def test_entry_point_registers_vllm_rl():
    """verl's own plugin discovery (the installed entry point) registers every piece; the
    check command says so, in a fresh process."""
    done = subprocess.run([sys.executable, "-m", "vllm_rl.integrations.verl"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    code = ("import verl\n"
            "from verl.trainer.ppo.v1 import get_trainer_cls\n"
            "from verl.experimental.agent_loop.agent_loop import _agent_loop_registry\n"
            "from verl.workers.rollout.replica import get_rollout_replica_class\n"
            "from verl.workers.rollout.base import get_rollout_class\n"
            "print(get_trainer_cls('vllm_rl_sync').__name__,"
            " _agent_loop_registry['vllm_rl_agent']['_target_'],"
            " get_rollout_replica_class('vllm_rl').__name__,"
            " get_rollout_class('vllm_rl').__name__)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["RLTrainerSync", "vllm_rl.integrations.verl.agent_loop.RLAgentLoop",
                                   "RLReplica", "ServerAdapter"]


def test_check_fails_loudly_without_the_plugin():
    env = {**os.environ, "VERL_USE_EXTERNAL_PLUGINS": "none"}
    done = subprocess.run([sys.executable, "-m", "vllm_rl.integrations.verl"],
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 1
    assert "NOT registered" in done.stderr and "rollout replica 'vllm_rl'" in done.stderr


def test_flags_reach_the_engine_and_records_come_back(rollout_batch):
    fields = rollout_batch.non_tensor_batch
    records = [RolloutInfo.decode(r) for r in fields["vllm_rl"]]
    assert all(r is not None for r in records), "every sample carries its record"
    lengths = rollout_batch.batch["response_mask"].sum(-1).tolist()
    for info, length in zip(records, lengths):
        assert info.length == length          # the record describes the tokens returned
    by_group: dict[str, list[RolloutInfo]] = {}
    for info in records:
        by_group.setdefault(info.group_id, []).append(info)
    assert sorted(by_group) == [f"uid-{i}" for i in range(6)]
    assert all(len(v) == N for v in by_group.values())
    reasons = {r.reason for r in records}
    assert Reason.DARTS_CANCELLED in reasons, "DARTS stopped groups in one scheduler"
    assert reasons & {Reason.DUET_TRIMMED, Reason.DUET_ABORTED}, "DUET's flags reached the engine"
    assert all(r.draft_proposed is not None for r in records), "DAS drafted for every sample"
    assert sum(r.draft_accepted or 0 for r in records) > 0
    scored = [r for r in records if r.length > 16]   # the 16th token went through the model
    unscored = [(r.reason.value, r.length, r.score, r.hidden_id) for r in scored
                if r.score is None or r.hidden_id is None]   # the vector stays on the worker
    assert scored and not unscored, unscored


def test_das_trees_are_keyed_by_the_dataset_index(verl_cluster, rollout_batch):
    """The agent loop names each problem "{data_source}:{index}", stable across steps
    (verl's uid is not): the server's trees are those problems."""
    import ray

    _, server, _ = verl_cluster
    problems = set(ray.get(server.das_stats.remote())["per_problem"])
    assert {f"arith:{i}" for i in range(6)} <= problems
    assert not any(p.startswith("uid-") for p in problems)


def test_early_ends_are_not_aborts(rollout_batch):
    """An early end the engine chose must not look like verl's "aborted" (its fully-async
    client would re-submit it): the server names the reason instead."""
    import json

    from vllm_rl.integrations.verl.server import with_record
    from verl.workers.rollout.replica import TokenOutput

    for raw in rollout_batch.non_tensor_batch["vllm_rl"]:
        info = RolloutInfo.decode(raw)
        final = type("Final", (), {"outputs": [type("C", (), {"rollout_info": info})()]})()
        out = with_record(TokenOutput(token_ids=[], stop_reason="aborted" if info.reason.early
                                      else "completed"), final)
        if info.reason.early:
            assert out.stop_reason == f"vllm_rl_{info.reason.value}"
        assert json.loads(json.dumps(out.extra_fields))["vllm_rl"] == raw


def test_loss_marks_on_real_records(rollout_batch):
    """The loss transform: DARTS selection exact per group, DUET 1/ε weights, the rest out."""
    from conftest import shortest_violations

    from vllm_rl.integrations.verl.loss import mark_metrics, training_marks

    extra = [dict(zip(rollout_batch.non_tensor_batch, values))
             for values in zip(*rollout_batch.non_tensor_batch.values())]
    marks = training_marks(extra)
    by_group: dict[str, list] = {}
    for m in marks:
        by_group.setdefault(m.info.group_id, []).append(m)
    for gid, group in by_group.items():
        infos = [m.info for m in group]
        assert not shortest_violations(infos, M), (gid, shortest_violations(infos, M))
        assert sum(m.info.selected and not m.info.eps_kept for m in group) <= M
        for m in group:
            if m.info.reason in (Reason.DARTS_CANCELLED, Reason.DUET_ABORTED):
                assert not m.keep and m.weight == 0
            if m.keep:
                assert m.info.selected
                assert m.weight == pytest.approx(1 / m.info.keep_prob if m.info.keep_prob else 1)
    metrics = mark_metrics(marks)
    eps_kept = sum(m.keep and m.eps_kept for m in marks)    # beside the M of their group
    assert metrics["vllm_rl/kept_fraction"] <= (M * len(by_group) + eps_kept) / len(marks)
    assert sum(m.keep and not m.eps_kept for m in marks) <= M * len(by_group)


def test_router_keeps_groups_and_problems_together():
    """Fake replicas (no engine): no group is split, a problem keeps its replica across
    steps, and adding a replica moves only the problems it now wins."""
    from vllm_rl.integrations.verl.router import RLRouter, rendezvous_order

    def params(uid, problem):
        return {"extra_args": {"vllm_rl": {"group": {"id": uid, "size": 2, "redundant": 4},
                                           "das": {"problem_id": problem}}}}

    servers = {f"10.0.0.{i}:800{i}": f"handle-{i}" for i in range(4)}
    router = RLRouter(servers, {"load_factor": None})
    placed = {}
    for step in range(3):
        for p in range(40):
            uid = f"step{step}-{p}"
            got = {router.acquire_server(f"r{step}-{p}-{s}", params(uid, f"prob-{p}"))[0]
                   for s in range(4)}
            assert len(got) == 1, f"group {uid} split over {got}"
            placed.setdefault(p, set()).update(got)
    assert all(len(v) == 1 for v in placed.values()), "a problem moved between steps"
    router.add_servers({"10.0.0.9:8009": "handle-9"})
    moved = 0
    for p in range(40):
        now = router.acquire_server(f"new-{p}", params(f"s9-{p}", f"prob-{p}"))[0]
        before = next(iter(placed[p]))
        if now != before:
            moved += 1
            assert now == "10.0.0.9:8009"
            assert rendezvous_order(f"prob-{p}", list(router._servers))[0] == now
    assert 0 < moved < 20
    # bounded load: a hot problem spills to its next replica, the group still whole
    loaded = RLRouter(servers, {"load_factor": 1.0})
    for k in range(12):
        got = {loaded.acquire_server(f"h{k}-{s}", params(f"hot-{k}", "prob-hot"))[0]
               for s in range(4)}
        assert len(got) == 1
    assert max(loaded._inflight_requests.values()) - min(loaded._inflight_requests.values()) <= 8
    # requests without flags: verl's default balancing
    assert router.acquire_server("plain", {"temperature": 1.0})[0] in router._servers


def test_pause_and_resume_keep_rl_state_consistent(verl_cluster, rollout_batch):
    """verl's abort_all_requests (pause) mid-step: every request drains, aborted samples
    come back "aborted" (verl may resume them), nothing is left in flight, and the next
    step's groups still get the exact DARTS selection.

    Ordered on the engine, never on the clock: the interrupted step's samples cannot end
    early (ignore_eos, no DUET; DARTS never stops a group without a valid sample; ARRoL
    scores without pruning), and the abort comes once half of them are in the engine and
    ARRoL has scored one at its 16th token (the head's own count), i.e. with 240 tokens
    of it still to go."""
    import ray

    from vllm_rl.task import heldout_prompts

    config, server, router = verl_cluster
    long_step = verl_config("~actor_rollout_ref.rollout.engine_kwargs.vllm_rl.flags.duet")

    async def interrupted():
        from verl.experimental.agent_loop.agent_loop import AgentLoopWorker  # noqa: F401

        scored = (await server.arrol_info.remote())["scored"]
        loop = asyncio.get_running_loop()
        task = loop.run_in_executor(None, run_agent_loop, long_step, router,
                                    heldout_prompts(8), [f"p-{i}" for i in range(8)],
                                    list(range(8)), {"ignore_eos": True})
        deadline = time.monotonic() + 600                 # a safety net, not an order
        while (await server.num_unfinished_requests.remote() < 8 * N // 2
               or (await server.arrol_info.remote())["scored"] == scored):
            assert not task.done(), "the step ended before it could be interrupted"
            assert time.monotonic() < deadline, "no sample reached l_detect in 600 s"
            await asyncio.sleep(0.02)
        aborted = await server.abort_all_requests.remote()
        await server.resume_generation.remote()
        return aborted, await task

    stats_before = ray.get(server.das_stats.remote())
    version = ray.get(server.arrol_update.remote(None, None, True, 7))
    aborted, out = asyncio.run(interrupted())
    assert aborted["aborted_count"] > 0
    assert ray.get(server.num_unfinished_requests.remote()) == 0
    raw = out.non_tensor_batch.get("vllm_rl", [None] * len(out))
    records = [RolloutInfo.decode(r) for r in raw]
    # aborted: no record, or reason "abort" (never an early end); nothing in this step can
    # end early, so every other sample (parked by the pause, then served) ran to its length
    assert any(r is None or r.reason is Reason.ABORT for r in records)
    assert all(r is None or r.reason in (Reason.ABORT, Reason.LENGTH) for r in records), \
        [r.reason.value for r in records if r is not None]
    from vllm_rl.integrations.verl.loss import training_marks

    extra = [dict(zip(out.non_tensor_batch, v)) for v in zip(*out.non_tensor_batch.values())]
    for record, mark in zip(records, training_marks(extra)):
        if record is None or record.reason is Reason.ABORT:
            assert not mark.keep and mark.weight == 0, "an aborted sample leaves the loss"
    # the prefix-cache reset of a weight sync, then the RL state: trees and head kept
    ray.get(server.clear_kv_cache.remote())
    stats_after = ray.get(server.das_stats.remote())
    assert stats_after["problems"] >= stats_before["problems"] > 0
    assert ray.get(server.arrol_info.remote())["version"] == version == 7
    after = run_agent_loop(config, router, heldout_prompts(4), [f"q-{i}" for i in range(4)],
                           list(range(4)))
    from conftest import shortest_violations

    infos = [RolloutInfo.decode(r) for r in after.non_tensor_batch["vllm_rl"]]
    groups: dict[str, list] = {}
    for info in infos:
        groups.setdefault(info.group_id, []).append(info)
    for gid, group in groups.items():
        from vllm_rl.darts.rule import annotate_group

        marked = annotate_group(group, M, M - 1, True)
        assert not shortest_violations(marked, M), gid
    assert ray.get(server.num_unfinished_requests.remote()) == 0


def _record(reason: Reason, length: int, group: str, rank: int | None, **kw) -> dict:
    info = RolloutInfo(reason=reason, length=length, group_id=group, finish_rank=rank, **kw)
    flags = {"group": {"id": group, "size": 2, "redundant": 4}, "darts": {"mode": "shortest"}}
    import json

    return {"vllm_rl": info.encode(), "vllm_rl_flags": json.dumps(flags)}


def test_dropped_samples_leave_the_grpo_baseline_and_weights_scale_advantages():
    """What the trainer mode does with the marks, on verl's own GRPO estimator and
    TransferQueue's batch type: dropped samples change nobody's advantage; a DUET-kept
    sample's advantage is 1/ε times its unweighted one."""
    import torch
    from transfer_queue import KVBatchMeta
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    from vllm_rl.integrations.verl.loss import scale_rows, training_marks
    from vllm_rl.integrations.verl.trainer import kept_batch

    extra = [_record(Reason.EOS, 5, "g", 1), _record(Reason.EOS, 7, "g", 2, weight=4.0,
                                                      keep_prob=0.25),
             _record(Reason.DARTS_CANCELLED, 7, "g", None, weight=0.0),
             _record(Reason.DUET_ABORTED, 3, "g", 3, weight=0.0),
             {"vllm_rl_flags": '{"group": {"id": "g"}}'},                 # aborted unstarted
             {}]                                                           # no flags: stock
    marks = training_marks(extra)
    assert [m.keep for m in marks] == [True, True, False, False, False, True]
    assert [m.weight for m in marks] == [1.0, 4.0, 0.0, 0.0, 0.0, 1.0]
    # the DUET-kept sample is outside DARTS's pool: selected beside the M (composition rule)
    assert [m.info.selection for m in marks[:2]] == ["shortest", "eps_kept"]

    batch = KVBatchMeta(keys=[f"k{i}" for i in range(6)], tags=[{"i": i} for i in range(6)],
                        partition_id="train")
    kept = kept_batch(batch, [m.keep for m in marks])
    assert kept.keys == ["k0", "k1", "k5"] and [t["i"] for t in kept.tags] == [0, 1, 5]

    scores = torch.tensor([1.0, 0.0, 1.0, 1.0])          # the first four share uid "g"
    mask = torch.ones(4, 3)
    rewards = torch.zeros(4, 3)
    rewards[:, -1] = scores
    everyone, _ = compute_grpo_outcome_advantage(rewards, mask, np.array(["g"] * 4))
    only_kept, _ = compute_grpo_outcome_advantage(rewards[:2], mask[:2], np.array(["g"] * 2))
    assert not torch.allclose(everyone[:2], only_kept)   # dropped samples did move the baseline
    weighted = scale_rows(only_kept, [m.weight for m in marks[:2]])
    assert torch.allclose(weighted[1], 4.0 * only_kept[1]) and torch.allclose(weighted[0], only_kept[0])
    jagged = torch.nested.nested_tensor([torch.ones(2), torch.ones(5)], layout=torch.jagged)
    rows = scale_rows(jagged, [1.0, 4.0]).unbind()
    assert rows[0].tolist() == [1.0, 1.0] and rows[1].tolist() == [4.0] * 5


P = 4          # prompts in the trainer-mode step: problem 0 under DARTS, 1-3 under DUET


class MixedPolicy(StaticPolicy):
    """DARTS alone on problem 0 (samples cancelled or left unselected), DUET alone on the
    others with its gate at 12 tokens, before any answer marker (so every sample flips
    the ε-coin: aborted, or kept with weight 1/ε): one step holds every way a sample
    leaves the batch or the loss, or is weighted."""

    def flags(self, sample):
        out = super().flags(sample)
        if out is not None:
            out.pop("arrol", None)
            out.pop("duet" if sample.problem_id.endswith(":0") else "darts")
            if "duet" in out:
                out["duet"].update(k1=4, k2=8, grace=4)
        return out


class LocalAgentLoops:
    """verl's ``AgentLoopWorkerTQ`` (the Ray actor class unwrapped) in this process, as
    ``AgentLoopManagerTQ`` would drive it: samples go into TransferQueue as they finish."""

    def __init__(self, config, router):
        from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopWorkerTQ
        from verl.workers.rollout.llm_server import LLMServerClient

        worker_cls = AgentLoopWorkerTQ.__ray_metadata__.modified_class
        self.worker = worker_cls(config, LLMServerClient(config, router))

    def generate_sequences(self, prompts) -> None:
        async def run():
            await self.worker.generate_sequences(prompts)
            await asyncio.gather(*list(self.worker.background_tasks))

        asyncio.run(run())


class TaskReward:
    """The reward model's place in verl's colocated reward path: the task's verifier on
    each decoded response, at its last token (as verl's reward loop writes it)."""

    reward_loop_worker_handles = None

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def compute_rm_score(self, data):
        import torch
        from verl import DataProto

        from vllm_rl.task import reward

        width = data.batch["responses"].size(1)
        mask = data.batch["attention_mask"][:, -width:]
        scores = torch.zeros(mask.shape, dtype=torch.float32)
        prompts = [messages[0]["content"] for messages in data.non_tensor_batch["raw_prompt"]]
        for i, n in enumerate(mask.sum(-1).tolist()):
            if n:
                text = self.tokenizer.decode(data.batch["responses"][i, :n].tolist())
                scores[i, n - 1] = reward(prompts[i], text)
        return DataProto.from_dict(tensors={"rm_scores": scores})


@pytest.fixture
def transfer_queue(verl_cluster):
    """TransferQueue on the test's Ray cluster, initialised from verl's own config section
    as ``main_ppo`` does, with one storage unit (module docstring)."""
    import transfer_queue as tq

    config = verl_config("transfer_queue.backend.SimpleStorage.num_data_storage_units=1")
    tq.init(config.transfer_queue)
    yield tq
    tq.close()


def test_trainer_mode_runs_verls_step_on_transfer_queue(verl_cluster, transfer_queue, monkeypatch):
    """``vllm_rl_sync`` through verl's own ``PPOTrainer.step`` on a real TransferQueue:
    verl's ``AgentLoopWorkerTQ`` puts P×N real samples (records in ``extra_fields``),
    verl's ``ReplayBuffer`` samples them, verl's colocated reward path scores them, then
    ``RLTrainerSync._apply_records`` clears the samples outside their group's baseline
    (DARTS's unselected) from TransferQueue and hands verl's ``_balance_batch`` exactly
    the others, verl's bypass-mode log-prob step and GRPO ``_compute_advantage`` run on
    them, and the advantages come out ×1/ε for DUET's ε-kept samples, ×0 for its aborted.

    Stood in for, as ``PPOTrainer.init`` builds them on GPUs: the actor worker group (only
    its data-parallel layout is read: 2 ranks), the checkpoint manager (``sleep_replicas``,
    a no-op: no GPU memory to free), the reward loop manager (``compute_rm_score`` with the
    task's verifier), the dataloader (one batch of the task's prompts), and the agent loop
    manager (verl's worker class in this process instead of a Ray actor).  No actor update
    (``critic_warmup``): that is the GPU actor's.  ARRoL's head training is off
    (``vllm_rl.arrol=false`` in the trainer's settings; the ARRoL feedback test covers it).
    """
    import json

    import torch
    from omegaconf import open_dict
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage
    from verl.trainer.ppo.v1 import get_trainer_cls
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    from vllm_rl.integrations.common.advantages import step_diagnostics
    from vllm_rl.integrations.verl import FLAGS_KEY
    from vllm_rl.integrations.verl.loss import training_marks
    from vllm_rl.integrations.verl.trainer import RLTrainerSync
    from vllm_rl.task import heldout_prompts

    tq = transfer_queue
    _, _, router = verl_cluster
    config = verl_config("trainer.v1.trainer_mode=vllm_rl_sync",
                         "algorithm.adv_estimator=grpo",
                         "algorithm.rollout_correction.bypass_mode=true",  # old = rollout log-probs
                         f"data.train_batch_size={P}",
                         "trainer.critic_warmup=1000")                      # no actor update
    with open_dict(config):
        settings = config.actor_rollout_ref.rollout.engine_kwargs.vllm_rl
        settings.arrol = False
        settings.policy = f"{MixedPolicy.__module__}.MixedPolicy"

    trainer = get_trainer_cls(config.trainer.v1.trainer_mode)(config)
    assert type(trainer) is RLTrainerSync
    assert trainer.trainer_mode == "sync" and type(trainer.replay_buffer) is ReplayBuffer
    trainer._init_tokenizer()
    trainer.global_steps = 1
    trainer.curr_step_profile = False
    trainer.train_dataloader_it = iter([{
        "raw_prompt": np.array([[{"role": "user", "content": p}] for p in heldout_prompts(P)],
                               dtype=object),
        "index": np.array(list(range(P)), dtype=object),
        "data_source": np.array(["arith"] * P, dtype=object)}])
    trainer.agent_loop_manager = LocalAgentLoops(config, router)
    trainer.reward_loop_manager = TaskReward(trainer.tokenizer)
    trainer.checkpoint_manager = type("NoGPU", (), {"sleep_replicas": lambda self: None})()
    trainer.actor_rollout_wg = type("DataParallel", (), {"_dispatch_info": {"actor": [0, 1]}})()

    seen: dict = {}

    def spy(name, fn):                # verl's own method, the keys it got and its output
        def wrapped(self, batch, *args, **kwargs):
            seen[name + ".in"] = list(batch.keys)
            seen[name] = fn(self, batch, *args, **kwargs)
            return seen[name]
        return wrapped

    def sample(*args, **kwargs):      # verl's sampling, then the records while all are there
        out = sampled_by_verl(*args, **kwargs)
        seen["sample"] = out[0]
        seen["records"] = list(tq.kv_batch_get(keys=out[0].keys, partition_id="train",
                                               select_fields=["extra_fields"])["extra_fields"])
        return out

    sampled_by_verl = trainer.replay_buffer.sample
    monkeypatch.setattr(trainer.replay_buffer, "sample", sample)
    for name in ("_balance_batch", "_compute_advantage"):
        monkeypatch.setattr(PPOTrainer, name, spy(name, getattr(PPOTrainer, name)))
    metrics: dict = {}
    batch = trainer.step(metrics, {})

    sampled = seen["sample"]
    assert len(sampled) == P * N
    marks = training_marks(seen["records"])
    stay = [k for k, m in zip(sampled.keys, marks) if m.baseline]
    leave = [k for k, m in zip(sampled.keys, marks) if not m.baseline]

    # the records: DARTS's group trains on exactly its selected M, the rest leave the batch;
    # DUET's aborted stay for the baseline with weight 0, its ε-kept weigh 1/ε = 2
    darts = [m for m, r in zip(marks, seen["records"]) if "darts" in json.loads(r[FLAGS_KEY])]
    assert len(darts) == N and sum(m.baseline for m in darts) == M
    assert all(m.keep == m.baseline == bool(m.info.selected) for m in darts)
    duet = [m for m in marks if m not in darts]
    assert all(m.baseline for m in duet)
    for mark in duet:
        if mark.info.reason is Reason.DUET_ABORTED:
            assert not mark.keep and mark.weight == 0.0
        elif mark.eps_kept:
            assert mark.keep and mark.weight == pytest.approx(1 / mark.info.keep_prob) == 2.0
        else:
            assert mark.keep and mark.weight == 1.0
    assert leave, "DARTS leaves N - M samples out"
    coins = [m for m in duet if m.eps_kept or m.info.reason is Reason.DUET_ABORTED]
    assert any(m.eps_kept for m in coins) and not all(m.eps_kept for m in coins), \
        "12 coins at ε=0.5 gave both sides"
    assert metrics["vllm_rl/dropped"] == sum(not m.keep for m in marks)

    # the samples out of the baseline are cleared from TransferQueue, and verl's balancing
    # gets exactly the others, in verl's order
    listed = tq.kv_list("train")["train"]
    assert not set(leave) & set(listed) and set(stay) <= set(listed)
    assert seen["_balance_batch.in"] == stay
    balanced = seen["_balance_batch"]
    padding = [k for k, t in zip(balanced.keys, balanced.tags) if t.get("is_padding")]
    assert sorted(balanced.keys) == sorted(stay + padding) and len(balanced) % 2 == 0
    assert balanced.extra_info["temperature"] == config.actor_rollout_ref.rollout.temperature
    assert seen["_compute_advantage.in"] == balanced.keys == batch.keys

    # the advantages: verl's GRPO estimator over the baseline samples alone, times weights
    data = tq.kv_batch_get(keys=stay, partition_id="train",
                           select_fields=["uid", "response_mask", "rm_scores", "advantages"])
    mask = data["response_mask"].to_padded_tensor(0).float()
    scores = data["rm_scores"].to_padded_tensor(0.0)
    got = data["advantages"].to_padded_tensor(0.0)
    uids = np.array(list(data["uid"]), dtype=object)
    expected, _ = compute_grpo_outcome_advantage(scores, mask, uids)
    weights = torch.tensor([m.weight for m in marks if m.baseline]).unsqueeze(-1)
    torch.testing.assert_close(got, expected * weights)
    if padding:
        pad = tq.kv_batch_get(keys=padding, partition_id="train", select_fields=["advantages"])
        assert not pad["advantages"].to_padded_tensor(0.0).any()
    # the step's diagnostics reach verl's metrics, computed on the advantages verl stored
    # (whether any group's rewards differ is up to the untrained model's sampling)
    kept = [m for m in marks if m.baseline]
    assert metrics["vllm_rl/loss_samples"] == sum(m.keep for m in kept)
    diagnostics = step_diagnostics(kept, got[:, 0].tolist(), [m.info.group_id for m in kept])
    assert {k: metrics[f"vllm_rl/{k}"] for k in diagnostics} == pytest.approx(diagnostics)
    assert (metrics["vllm_rl/ess_fraction"] > 0.0) == bool(got.any())
    assert 0.0 <= metrics["vllm_rl/ess_fraction"] <= 1.0


class PartialPolicy(StaticPolicy):
    """Problems 0 and 1 of every four under DUET with its gate at 8 tokens and a keep
    chance of 1e-6 (their groups end within a few tokens), 2 and 3 plain groups (they
    run to their natural end): a step that ends once two of four groups are complete
    carries the plain ones."""

    def flags(self, sample):
        out = super().flags(sample)
        if out is not None:
            out.pop("arrol", None)
            out.pop("darts", None)
            if int(sample.problem_id.rsplit(":", 1)[1]) % 4 < 2:
                out["duet"].update(k1=4, k2=4, grace=4, poll=4, eps=1e-6)
            else:
                out.pop("duet")
        return out


class BackgroundAgentLoops(LocalAgentLoops):
    """:class:`LocalAgentLoops` that returns once the samples are dispatched, as
    ``AgentLoopManagerTQ`` does (its Ray call on the worker only spawns them): they run
    on an event loop in another thread while verl's replay buffer polls TransferQueue."""

    def __init__(self, config, router):
        import threading

        super().__init__(config, router)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def generate_sequences(self, prompts) -> None:
        asyncio.run_coroutine_threadsafe(self.worker.generate_sequences(prompts),
                                         self.loop).result()

    def close(self) -> None:
        async def drain():
            await asyncio.gather(*list(self.worker.background_tasks))

        asyncio.run_coroutine_threadsafe(drain(), self.loop).result()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()


def test_partial_rollouts_carry_groups_across_verls_steps(verl_cluster, transfer_queue):
    """Partial rollouts through verl's own ``PPOTrainer.step``, twice, on a real
    TransferQueue: step 1 launches four groups, the trainer sees two finished in
    TransferQueue and ends the step on the replica (``end_step``), the plain groups come
    back carried (out of the step's batch and of TransferQueue, into the buffer); step 2
    (every launched group awaited) continues them on the engine and trains them whole:
    each continued sample's record covers the whole sample (its start step, steps
    crossed, length), its first tokens and logprobs are step 1's, and the group trains
    with the members that ended in step 1.  Stood in for as in the trainer-mode test,
    and the replica set (``llm_server_manager``: the one server actor)."""
    from types import SimpleNamespace

    from omegaconf import open_dict
    from verl.trainer.ppo.v1 import get_trainer_cls

    from vllm_rl.integrations.common.partial import PartialConfig
    from vllm_rl.integrations.verl.partial import PartialSampling
    from vllm_rl.integrations.verl.trainer import RLTrainerSync
    from vllm_rl.task import heldout_prompts

    tq = transfer_queue
    _, server, router = verl_cluster
    config = verl_config("trainer.v1.trainer_mode=vllm_rl_sync",
                         "algorithm.adv_estimator=grpo",
                         "algorithm.rollout_correction.bypass_mode=true",
                         f"data.train_batch_size={P}",
                         "trainer.critic_warmup=1000",
                         "+actor_rollout_ref.rollout.engine_kwargs.vllm_rl.partial.over=2")
    with open_dict(config):
        settings = config.actor_rollout_ref.rollout.engine_kwargs.vllm_rl
        settings.arrol = False
        settings.policy = f"{PartialPolicy.__module__}.PartialPolicy"
    trainer = get_trainer_cls(config.trainer.v1.trainer_mode)(config)
    assert type(trainer) is RLTrainerSync and isinstance(trainer.replay_buffer, PartialSampling)
    trainer.replay_buffer.inner.poll_interval = 0.05
    trainer._init_tokenizer()
    trainer.curr_step_profile = False
    prompts = heldout_prompts(2 * P)
    trainer.train_dataloader_it = iter([{
        "raw_prompt": np.array([[{"role": "user", "content": p}] for p in prompts[s:s + P]],
                               dtype=object),
        "index": np.array(list(range(s, s + P)), dtype=object),
        "data_source": np.array(["arith"] * P, dtype=object)} for s in (0, P)])
    loops = BackgroundAgentLoops(config, router)
    trainer.agent_loop_manager = loops
    trainer.reward_loop_manager = TaskReward(trainer.tokenizer)
    trainer.checkpoint_manager = type("NoGPU", (), {"sleep_replicas": lambda self: None})()
    trainer.actor_rollout_wg = type("DataParallel", (), {"_dispatch_info": {"actor": [0, 1]}})()
    trainer.llm_server_manager = SimpleNamespace(
        rollout_replicas=[SimpleNamespace(server_handle=server)])

    def records(batch):
        data = tq.kv_batch_get(keys=batch.keys, partition_id="train",
                               select_fields=["uid", "responses", "rollout_log_probs",
                                              "extra_fields"])
        out = []
        for uid, r, lp, e in zip(data["uid"], data["responses"].unbind(),
                                 data["rollout_log_probs"].unbind(), data["extra_fields"]):
            out.append((str(uid), r.tolist(), lp.tolist(), RolloutInfo.decode(e["vllm_rl"])))
        return out

    try:
        trainer.global_steps = 1
        metrics: dict = {}
        batch = trainer.step(metrics, {})
        first = [r for r in records(batch) if r[3] is not None]
        buffer = trainer.partial.buffer
        assert len(buffer) >= 1, "the plain groups were still generating: carried"
        assert metrics["vllm_rl/carried_groups"] == len(buffer)
        assert metrics["vllm_rl/carried_samples"] == buffer.samples() > 0
        carried_uids = {g.prompt for g in buffer.groups}
        assert not carried_uids & {uid for uid, *_ in first}, "carried groups left the batch"
        listed = tq.kv_list("train")["train"]
        assert not any(k.split("_")[0] in carried_uids for k in listed)
        assert all(info.reason is not Reason.CARRIED for *_, info in first)
        assert {info.step for *_, info in first} == {1}
        parts = {g.prompt: (g.ended, g.carried) for g in buffer.groups}
        for ended, carried in parts.values():
            assert len(ended) + len(carried) == N
            for part in carried:
                assert part.info.reason is Reason.CARRIED and part.info.step == 1
                assert part.info.length == len(part.token_ids) == len(part.logprobs)
        tq.kv_clear(keys=batch.keys, partition_id="train")      # as verl's fit() does

        trainer.partial.cfg = PartialConfig(over=1.0)            # step 2 awaits every group
        trainer.global_steps = 2
        metrics = {}
        batch = trainer.step(metrics, {})
        second = records(batch)
        assert len(trainer.partial.buffer) == 0
        continued = [r for r in second if r[0] in carried_uids]
        assert len(continued) == N * len(carried_uids), "each continued group trains whole"
        for uid, (ended, carried) in parts.items():
            rows = [r for r in second if r[0] == uid]
            for part in carried:               # its whole sample: step 1's part, then more
                match = [r for r in rows if r[1][:len(part.token_ids)] == part.token_ids
                         and r[3].start_step == 1 and r[3].steps_crossed == 1
                         and r[3].prior_tokens == len(part.token_ids)]
                assert match, "a continued sample starts with its carried tokens"
                _, tokens, logprobs, info = match[0]
                assert logprobs[:len(part.logprobs)] == pytest.approx(part.logprobs)
                assert info.step == 2 and info.reason is not Reason.CARRIED
                assert info.length == len(tokens)
            for part in ended:                 # ended in step 1, trained with its group now
                assert any(r[1] == part.token_ids and r[3].step == 1 for r in rows)
        assert 0.0 < metrics["vllm_rl/carried_share"] <= 1.0
        assert metrics["vllm_rl/staleness_max"] == 1.0
    finally:
        loops.close()


def test_partial_rollouts_buffer_rides_in_verls_checkpoint(tmp_path, monkeypatch):
    """The trainer mode keeps the carried groups in each checkpoint (beside verl's
    ``data.pt``) and restores them on resume; ``loss="tis"`` refuses a verl config that
    would not run verl's token-level TIS.  verl's own save and load (the GPU worker
    groups' checkpoints) are stood in for by the step-folder bookkeeping they do."""
    from verl.trainer.ppo.v1 import get_trainer_cls
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

    from vllm_rl.integrations.common.partial import CarriedGroup, Part
    from vllm_rl.integrations.verl.partial import CHECKPOINT_FILE

    monkeypatch.setattr(PPOTrainerSync, "_save_checkpoint", lambda self: None)
    monkeypatch.setattr(PPOTrainerSync, "_load_checkpoint",
                        lambda self: setattr(self, "global_steps", 3))
    args = ("trainer.v1.trainer_mode=vllm_rl_sync", f"trainer.default_local_dir={tmp_path}",
            "+actor_rollout_ref.rollout.engine_kwargs.vllm_rl.partial.over=2")
    trainer = get_trainer_cls("vllm_rl_sync")(verl_config(*args))
    part = Part([5, 6, 7], [-0.5, -0.25, -1.0],
                RolloutInfo(reason=Reason.CARRIED, length=3, group_id="u-1", step=3,
                            start_step=2))
    trainer.partial.buffer.groups.append(CarriedGroup(
        "u-1", [1, 2], {"group": {"id": "u-1", "size": 2}}, "u-1", 2, 4, 2,
        ended=[part], carried=[part], row={"uid": "u-1", "index": 7}))
    trainer.global_steps = 3
    trainer._save_checkpoint()
    assert (tmp_path / "global_step_3" / CHECKPOINT_FILE).exists()
    resumed = get_trainer_cls("vllm_rl_sync")(verl_config(*args))
    resumed._load_checkpoint()
    assert resumed.partial.state_dict() == trainer.partial.state_dict()
    (g,) = resumed.partial.buffer.groups
    assert g.carried[0].info.reason is Reason.CARRIED and g.row == {"uid": "u-1", "index": 7}
    with pytest.raises(ValueError, match="rollout_is=token"):
        get_trainer_cls("vllm_rl_sync")(verl_config(
            *args, "+actor_rollout_ref.rollout.engine_kwargs.vllm_rl.partial.loss=tis"))
    tis = get_trainer_cls("vllm_rl_sync")(verl_config(
        *args, "+actor_rollout_ref.rollout.engine_kwargs.vllm_rl.partial.loss=tis",
        "algorithm.rollout_correction.rollout_is=token"))
    assert tis.partial.cfg.loss == "tis"


def test_partial_rollouts_on_verl_are_all_or_nothing():
    """verl's carry path takes copies of the carried groups at launch and changes the
    buffer once, when the step's samples are read (``split``): a step that fails between
    (a replica down, the agent loop raising) leaves every carried sample in the buffer,
    and the next launch sends each of them again; the split then trains the group whole
    and leaves nothing behind.  A bad step is refused before any replica sees it."""
    import json

    from vllm_rl.flags import FlagError
    from vllm_rl.integrations.common.partial import CarriedGroup, Part, PartialConfig
    from vllm_rl.integrations.verl.partial import (CARRY_KEY, PartialRollouts,
                                                   StoredSample, batch_of)
    from vllm_rl.integrations.verl.trainer import RLTrainerSync

    partial = PartialRollouts(PartialConfig(over=2.0), n=2, max_tokens=16)
    ended = Part([4], [-0.5], RolloutInfo(reason=Reason.EOS, length=1, group_id="u-1",
                                          step=1, start_step=1))
    carried = Part([5, 6, 7], [-0.5, -0.25, -1.0],
                   RolloutInfo(reason=Reason.CARRIED, length=3, group_id="u-1", step=1,
                               start_step=1, weight=0.0))
    partial.buffer.groups.append(CarriedGroup(
        "u-1", [1, 2], {"group": {"id": "u-1", "size": 2}}, "u-1", 2, 2, 1,
        ended=[ended], carried=[carried], row={"uid": "u-1", "index": 7}))
    before = json.dumps(partial.state_dict())
    fresh = batch_of([{"uid": "u-2", "index": 8}], 2)
    for step in (2, 3):        # step 2 fails after its launch; step 3 sends it all again
        batch = partial.launch(step, fresh)
        assert json.dumps(partial.state_dict()) == before, "changed before the split"
        (raw,) = [r for r in batch[CARRY_KEY] if r]
        members = json.loads(raw)["members"]
        assert [m["part"]["token_ids"] for m in members] == [[4], [5, 6, 7]]
        assert members[1]["flags"]["partial"]["prior_tokens"] == 3
    whole = RolloutInfo(reason=Reason.EOS, length=5, group_id="u-1", step=3, start_step=1,
                        steps_crossed=2, prior_tokens=3)
    new = RolloutInfo(reason=Reason.EOS, length=2, group_id="u-2", step=3, start_step=3)
    stay = partial.split([
        StoredSample("k1", "u-1", [1, 2], [4], [-0.5], ended.info, None),
        StoredSample("k2", "u-1", [1, 2], [5, 6, 7, 8, 9], [-0.5] * 5, whole, None),
        StoredSample("k3", "u-2", [3], [8, 9], [-0.1, -0.2], new, None),
        StoredSample("k4", "u-2", [3], [8, 9], [-0.1, -0.2], new, None)])
    assert stay == [True] * 4 and len(partial.buffer) == 0
    trainer = RLTrainerSync.__new__(RLTrainerSync)
    for bad in (1.5, True, "3", None):
        with pytest.raises(FlagError, match="partial.step"):
            trainer._end_step(bad)


def test_arrol_feedback_trains_calibrates_and_pushes(verl_cluster, rollout_batch):
    """ARRoL's trainer side on real records and the task's verifier: the records name
    their hidden states at l_detect (hidden_id), taken from the server actor
    (arrol_hidden, as the trainer does); the cold start pushes the head only, then head
    and calibration; the server actor takes both."""
    import ray
    from transformers import AutoTokenizer

    from vllm_rl.arrol.controller import ArrolFeedback
    from vllm_rl.task import MODEL_PATH, reward

    _, server, _ = verl_cluster
    tok = AutoTokenizer.from_pretrained(MODEL_PATH)
    fields = rollout_batch.non_tensor_batch
    from vllm_rl.integrations.verl.trainer import fetch_hidden

    infos = [RolloutInfo.decode(r) for r in fields["vllm_rl"]]
    assert all(i.hidden is None for i in infos if i is not None)    # never in the record
    named = [i for i in infos if i is not None and i.hidden_id is not None]
    assert named, "return_hidden: the scored records name their hidden states"
    infos = fetch_hidden(infos, [server])
    assert all(i.hidden_state() is not None for i in infos
               if i is not None and i.hidden_id is not None)
    responses = rollout_batch.batch["responses"]
    mask = rollout_batch.batch["response_mask"].bool()
    rewards = [reward(p[0]["content"], tok.decode(r[m].tolist()))
               for p, r, m in zip(fields["raw_prompt"], responses, mask)]
    feedback = ArrolFeedback({"l_detect": 16}, cold_start_steps=2,
                             gate="cold")                    # the paper: the cold start alone
    first = feedback.observe(infos, rewards)
    assert first["calibration"] is None and first["cold_start"]
    assert ray.get(server.arrol_update.remote(**first)) == first["version"]
    assert not ray.get(server.arrol_info.remote())["calibrated"]
    second = feedback.observe(infos, rewards)
    assert second["calibration"] is not None and second["version"] == first["version"] + 1
    assert ray.get(server.arrol_update.remote(**second)) == second["version"]
    info = ray.get(server.arrol_info.remote())
    assert info["calibrated"] and info["version"] == second["version"]
    ray.get(server.arrol_update.remote(None, None, True))       # back to scoring only


def test_a_failing_registration_is_logged_at_warning():
    """verl swallows a plugin's import error at DEBUG level; ours says why at WARNING."""
    code = ("import vllm_rl.integrations.verl.keys as keys\n"
            "keys.CHECKED = ('0.0.0',)\n"
            "import verl\n"
            "import vllm_rl.integrations.verl as v\n"
            "v.check_registered()\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode != 0
    assert "vllm_rl could not register with verl" in done.stderr
    assert "checked against verl ('0.0.0',)" in done.stderr


def test_policy_fills_group_and_problem_and_refuses_bad_settings():
    from vllm_rl.integrations.common.policy import Sample, StaticPolicy, load_policy

    sample = Sample.of({"uid": "u1", "index": 7, "data_source": "gsm8k"}, n=8)
    flags = StaticPolicy({"das": True, "flags": {"group": {"size": 4}, "darts": {}}}).flags(sample)
    assert flags == {"group": {"id": "u1", "size": 4, "redundant": 8}, "darts": {},
                     "das": {"problem_id": "gsm8k:7"}}
    assert StaticPolicy({"flags": {"duet": {}}}).flags(
        Sample.of({"uid": "u1", "validate": True}, n=1)) is None
    assert load_policy({}).flags(sample) is None          # no flags: stock requests
    with pytest.raises(ValueError, match="needs the engine's drafter"):
        StaticPolicy({"flags": {"das": {}}})
    with pytest.raises(Exception, match="duet.eps"):
        StaticPolicy({"flags": {"duet": {"eps": 2.0}}})
    with pytest.raises(TypeError, match="not a RolloutPolicy"):
        load_policy({"policy": "vllm_rl.integrations.common.policy.Sample"})
