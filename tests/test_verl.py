"""vllm_rl as verl's rollout backend, against the real verl package (pinned by the install).

One real ``RLHttpServer`` actor (verl's vLLM server on the RL engine with the DAS drafter
and the ARRoL head, embedded model) runs in a local Ray cluster on the CPU.  verl's own ``AgentLoopWorker`` runs the
``vllm_rl_agent`` loop → ``LLMServerClient`` → the ``RLRouter`` actor → the server, so the
flags reach the engine the way they do in training, and the records come back in
``extra_fields``.  GPU placement groups and weight sync do not run on the CPU: the server
is created as a standalone actor on no GPU (the one fake here: ``workers=[]``).
"""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import numpy as np
import pytest

from vllm_rl import Reason, RolloutInfo
from vllm_rl.compat import vllm_version_shim

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
            "+actor_rollout_ref.rollout.engine_kwargs.vllm_rl.flags.duet.k2=16",
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


def run_agent_loop(config, router, prompts: list[str], uids: list[str], indices: list[int]):
    """verl's AgentLoopWorker.generate_sequences on one batch (each prompt repeated N
    times, as verl's trainer does), through LLMServerClient and the router actor."""
    from verl import DataProto
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
    from verl.workers.rollout.llm_server import LLMServerClient

    worker = AgentLoopWorker(config, LLMServerClient(config, router))
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
    unscored = [(r.reason.value, r.length, r.score, r.hidden is None) for r in scored
                if r.score is None or r.hidden is None]
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
        final = type("Final", (), {"outputs": [type("C", (), {"stop_reason": raw})()]})()
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
        assert sum(m.info.selected for m in group) <= M
        for m in group:
            if m.info.reason in (Reason.DARTS_CANCELLED, Reason.DUET_ABORTED):
                assert not m.keep and m.weight == 0
            if m.keep:
                assert m.info.selected
                assert m.weight == pytest.approx(1 / m.info.keep_prob if m.info.keep_prob else 1)
    metrics = mark_metrics(marks)
    assert metrics["vllm_rl/kept_fraction"] <= M / N


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
    step's groups still get the exact DARTS selection."""
    import ray

    from vllm_rl.task import heldout_prompts

    config, server, router = verl_cluster

    async def interrupted():
        from verl.experimental.agent_loop.agent_loop import AgentLoopWorker  # noqa: F401

        loop = asyncio.get_running_loop()
        task = loop.run_in_executor(None, run_agent_loop, config, router,
                                    heldout_prompts(8), [f"p-{i}" for i in range(8)],
                                    list(range(8)))
        while await server.num_unfinished_requests.remote() < 8 * N // 2:
            await asyncio.sleep(0.05)
        await asyncio.sleep(1.0)        # let some samples produce tokens first
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
    # aborted before its first token: no record; after: reason "abort" (never an early end)
    assert any(r is None or r.reason is Reason.ABORT for r in records)
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
        from vllm_rl.outcome import annotate_group

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
    assert [m.info.selection for m in marks[:2]] == ["shortest", "shortest"]

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


def test_arrol_feedback_trains_calibrates_and_pushes(verl_cluster, rollout_batch):
    """ARRoL's trainer side on real records (hidden states at l_detect) and the task's
    verifier: the cold start pushes the head only, then head and calibration; the server
    actor takes both."""
    import ray
    from transformers import AutoTokenizer

    from vllm_rl.integrations.verl.feedback import ArrolFeedback
    from vllm_rl.task import MODEL_PATH, reward

    _, server, _ = verl_cluster
    tok = AutoTokenizer.from_pretrained(MODEL_PATH)
    fields = rollout_batch.non_tensor_batch
    infos = [RolloutInfo.decode(r) for r in fields["vllm_rl"]]
    responses = rollout_batch.batch["responses"]
    mask = rollout_batch.batch["response_mask"].bool()
    rewards = [reward(p[0]["content"], tok.decode(r[m].tolist()))
               for p, r, m in zip(fields["raw_prompt"], responses, mask)]
    feedback = ArrolFeedback({"l_detect": 16}, cold_start_steps=2)
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
    code = ("import vllm_rl.integrations.verl as v\n"
            "v.CHECKED = ('0.0.0',)\n"
            "import verl\n"
            "v.check_registered()\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode != 0
    assert "vllm_rl could not register with verl" in done.stderr
    assert "checked against verl ('0.0.0',)" in done.stderr


def test_policy_fills_group_and_problem_and_refuses_bad_settings():
    from vllm_rl.integrations.verl.policy import Sample, StaticPolicy, load_policy

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
        load_policy({"policy": "vllm_rl.integrations.verl.policy.Sample"})
