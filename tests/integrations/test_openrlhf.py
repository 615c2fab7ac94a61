"""OpenRLHF (0.11.2) on the RL engine: ``vllm_rl.integrations.openrlhf``, on the CPU.

What runs for real: OpenRLHF's ``create_vllm_engines`` (with the launcher's patch in
place) builds the rollout actor; the actor's own methods (``generate_responses`` →
OpenRLHF's ``SingleTurnAgentExecutor`` → ``generate``, ``get_num_unfinished_requests``,
``reset_prefix_cache``, ``pause_generation`` / ``resume_generation``, the DAS and
weight-flush RPCs) drive the real RL engine (``AsyncLLM``, embedded model, DAS drafter)
with OpenRLHF's worker extension combined with ours; OpenRLHF's
``SamplesGenerator._process_response_into_experience`` and
``Experience.concat_experiences`` turn the responses into experiences; in a subprocess,
OpenRLHF's own ``train_ppo_ray`` parser through the launcher, and OpenRLHF's
``RemoteExperienceMaker.compute_advantages_and_returns`` (wrapped) on those experiences.

The fakes: the Ray placement and actor creation (``shared_pg`` is a stand-in object and
the actor class behind the patch builds the actor in this process instead of a Ray
worker; OpenRLHF's ``RolloutRayActor.options(...).remote(...)`` call itself is real), and
``flash_attn`` in the subprocess: a stub package providing the names OpenRLHF's model
modules import (flash-attn has no CPU build; nothing called here uses it).
"""
from __future__ import annotations

import asyncio
import copy
import gc
import json
import os
import subprocess
import sys
import textwrap

import pytest

N = 4                      # n_samples_per_prompt: M' samples per prompt
M = 2                      # DARTS: the M shortest valid enter training
MAX_TOKENS = 96
SETTINGS = {
    "das": {"budget": 2},
    "flags": {"darts": {"mode": "shortest"}, "group": {"size": M}, "das": {}},
    "engine": {"dtype": "float32", "max_num_seqs": 32},
}


class _FakePlacementGroup:
    """Stands in for the hybrid engine's shared placement group (no GPU bundles here)."""

    id = "fake-placement-group"


class _InProcessActorClass:
    """Behind the patched ``RolloutRayActor``: ``options(...)`` records OpenRLHF's Ray
    options, ``remote(**kwargs)`` builds the actor in this process on ``loop``."""

    def __init__(self, loop) -> None:
        self.loop, self.options_seen, self.kwargs_seen, self.actors = loop, [], [], []

    def options(self, **options):
        self.options_seen.append(options)
        return self

    def remote(self, *args, **kwargs):
        from vllm_rl.integrations.openrlhf.actor import RLRolloutActor

        self.kwargs_seen.append(dict(kwargs))
        actor = RLRolloutActor.__new__(RLRolloutActor)
        self.loop.run_until_complete(actor.__init__(*args, **kwargs))
        self.actors.append(actor)
        return actor


async def _shutdown(engine) -> None:
    """AsyncLLM's shutdown inside its loop, so that its output task and sockets close."""
    engine.shutdown()
    await asyncio.sleep(0)
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


@pytest.fixture(scope="module")
def rollout():
    """One RL rollout actor built by OpenRLHF's ``create_vllm_engines`` after the patch."""
    from vllm_rl.compat import vllm_version_shim

    vllm_version_shim()
    from openrlhf.trainer.ray import vllm_engine

    from vllm_rl.integrations.openrlhf import launcher
    from vllm_rl.integrations.openrlhf.actor import RLActorClass
    from vllm_rl.task import MODEL_PATH

    loop = asyncio.new_event_loop()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(vllm_engine, "RolloutRayActor", vllm_engine.RolloutRayActor)  # restored
        mp.setenv("RAY_ADDRESS", "fake")        # OpenRLHF's actor asks Ray for it otherwise
        mp.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")   # the actor sets it; restored
        mp.setenv("VLLM_RL_OPENRLHF", json.dumps(SETTINGS))
        replaced = launcher.patch(experience=False)
        assert isinstance(vllm_engine.RolloutRayActor, RLActorClass)
        assert replaced.settings == SETTINGS
        fake = _InProcessActorClass(loop)
        replaced.actor_cls = fake
        engines = vllm_engine.create_vllm_engines(
            num_engines=1, tensor_parallel_size=1, pretrain=str(MODEL_PATH), seed=0,
            full_determinism=False, enable_prefix_caching=True, enforce_eager=True,
            max_model_len=512, shared_pg=_FakePlacementGroup(), gpu_memory_utilization=None,
            vllm_enable_sleep=False)
        actor = engines[0]
        try:
            yield {"actor": actor, "loop": loop, "fake": fake}
        finally:
            loop.run_until_complete(_shutdown(actor.llm))
            del actor.llm, actor, engines, fake.actors[:]
            gc.collect()
            loop.close()


@pytest.fixture(scope="module")
def step(rollout, tmp_path_factory):
    """One rollout step as OpenRLHF's ``SamplesGenerator`` does it, into experiences."""
    from transformers import AutoTokenizer
    from vllm import SamplingParams

    from vllm_rl.task import MODEL_PATH, heldout_prompts

    actor, loop = rollout["actor"], rollout["loop"]
    tokenizer = AutoTokenizer.from_pretrained(str(MODEL_PATH))
    # SamplesGenerator._dispatch_prompts_to_vllm's params (logprobs: IS correction on)
    params = SamplingParams(temperature=1.0, top_p=1.0, top_k=-1, max_tokens=MAX_TOKENS,
                            min_tokens=1, skip_special_tokens=False, logprobs=1)
    prompts = heldout_prompts(4)

    async def run():
        calls = [actor.generate_responses(prompt=p, label=str(i), sampling_params=params,
                                          max_length=512, hf_tokenizer=tokenizer,
                                          num_samples=N)
                 for i, p in enumerate(prompts)]
        return await asyncio.gather(*calls)

    groups = loop.run_until_complete(run())
    from openrlhf.trainer.ppo_utils.experience import Experience
    from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator

    generator = SamplesGenerator.__new__(SamplesGenerator)
    responses = [r for group in groups for r in group]
    experiences = [generator._process_response_into_experience(r, max_len=512)
                   for r in responses]
    return {"prompts": prompts, "groups": groups, "responses": responses,
            "experiences": experiences, "tokenizer": tokenizer,
            "dir": tmp_path_factory.mktemp("openrlhf"), "Experience": Experience}


def test_create_vllm_engines_builds_the_rl_actor(rollout):
    """OpenRLHF's own create_vllm_engines, after the patch, builds our actor with its
    keywords turned into the RL engine's."""
    from vllm_rl.integrations.openrlhf.actor import RLRolloutActor
    from vllm_rl.integrations.openrlhf.worker import WORKER_EXTENSION

    fake, actor = rollout["fake"], rollout["actor"]
    assert isinstance(actor, RLRolloutActor)
    (kwargs,) = fake.kwargs_seen
    assert kwargs["worker_extension_cls"] == "openrlhf.trainer.ray.vllm_worker_wrap.WorkerWrap"
    assert kwargs["vllm_rl_settings"] == SETTINGS
    assert fake.options_seen[0]["num_gpus"] == 0.2          # OpenRLHF's hybrid-engine share
    config = actor.llm.vllm_config
    assert config.parallel_config.worker_extension_cls == WORKER_EXTENSION
    assert "vllm_rl" in str(config.scheduler_config.scheduler_cls)
    assert config.speculative_config is not None           # the DAS drafter
    assert str(config.model_config.dtype) == "torch.float32"   # settings' engine override


def test_unchecked_version_fails_loudly(monkeypatch):
    import vllm_rl.integrations.openrlhf as integration
    from vllm_rl.integrations.openrlhf import launcher

    monkeypatch.setattr(integration, "openrlhf_version", lambda: "0.10.1")
    with pytest.raises(RuntimeError, match=r"checked against openrlhf \('0.11.2',\)"):
        launcher.patch({})
    monkeypatch.setenv("VLLM_RL_OPENRLHF", json.dumps({"bogus": 1}))
    with pytest.raises(ValueError, match="unknown keys"):
        integration.load_settings()
    monkeypatch.setenv("VLLM_RL_OPENRLHF", json.dumps({"flags": {"darts": {"mode": "x"}}}))
    with pytest.raises(Exception, match="darts.mode"):
        integration.load_settings()


def test_settings_from_a_config_file(tmp_path, monkeypatch):
    from vllm_rl.integrations.openrlhf import load_settings

    path = tmp_path / "vllm_rl.json"
    path.write_text(json.dumps(SETTINGS))
    monkeypatch.delenv("VLLM_RL_OPENRLHF", raising=False)
    monkeypatch.setenv("VLLM_RL_OPENRLHF_CONFIG", str(path))
    assert load_settings() == SETTINGS
    monkeypatch.setenv("VLLM_RL_OPENRLHF", "{}")
    with pytest.raises(ValueError, match="not both"):
        load_settings()


def test_one_group_per_prompt_and_records_in_the_responses(step):
    from conftest import shortest_violations

    from vllm_rl import Reason, RolloutInfo

    for group in step["groups"]:
        assert len(group) == N
        infos = [RolloutInfo.decode(r["vllm_rl"]) for r in group]
        assert all(i is not None for i in infos)
        assert len({i.group_id for i in infos}) == 1                 # one group per prompt
        flags = json.loads(group[0]["vllm_rl_flags"])
        assert flags["group"] == {"id": infos[0].group_id, "redundant": N, "size": M}
        assert flags["das"]["problem_id"].startswith("prompt:")
        assert shortest_violations(infos, M) == []
        selected = [i for i in infos if i.selected]
        if any(i.reason is Reason.DARTS_CANCELLED for i in infos):
            assert len(selected) == M
        for r, info in zip(group, infos):
            logs = r["extra_logs"]
            assert logs["vllm_rl/weight"] == (1.0 if info.selected else 0.0)
            assert logs["vllm_rl/keep"] == (1.0 if info.selected else 0.0)
            assert logs["vllm_rl/length"] == info.length
            # the executor's tokens are the engine's, a cancelled sample's partial ones too
            start, end = (r["action_ranges"] or [(len(r["observation_tokens"]) - info.length,
                                                  len(r["observation_tokens"]))])[0]
            assert end - start == info.length
            assert (r["action_ranges"] == []) == (not info.selected)
    left_out = [r for r in step["responses"] if r["action_ranges"] == []]
    assert len(left_out) >= len(step["groups"]) * (N - M)   # M of N per group enter training


def test_records_reach_the_experience(step):
    import torch

    from vllm_rl import RolloutInfo

    for r, e in zip(step["responses"], step["experiences"]):
        info = RolloutInfo.decode(r["vllm_rl"])
        assert float(e.info["vllm_rl/weight"]) == r["extra_logs"]["vllm_rl/weight"]
        assert float(e.info["vllm_rl/keep"]) == (1.0 if info.selected else 0.0)
        assert int(e.action_mask.sum()) == (info.length if info.selected else 0)
        assert e.rollout_log_probs is not None
        assert int(e.response_length) == (info.length if info.selected else 0)
    batch = step["Experience"].concat_experiences(step["experiences"], 0)
    keep = batch.info["vllm_rl/keep"].reshape(-1)
    assert keep.shape[0] == len(step["responses"])
    assert torch.equal(batch.action_mask.sum(-1) > 0, keep > 0)


def test_actor_methods_on_the_rl_engine(rollout, step):
    """The rest of RolloutRayActor's methods, and the RL state across them."""
    actor, loop = rollout["actor"], rollout["loop"]
    assert actor.get_num_unfinished_requests() == 0
    stats = loop.run_until_complete(actor.das_stats())
    problems = {json.loads(r["vllm_rl_flags"])["das"]["problem_id"] for r in step["responses"]}
    assert problems <= set(stats["per_problem"])          # DAS trees keyed by the prompt

    async def cycle():
        await actor.pause_generation()
        await actor.resume_generation()
        await actor.reset_prefix_cache()
        return await actor.das_stats(), await actor.flush_weights()

    after, flushed = loop.run_until_complete(cycle())
    assert problems <= set(after["per_problem"])          # trees survive pause/reset
    assert flushed == 0                                    # no weights pending


def test_worker_extension_collects_openrlhf_weights_and_reloads_once():
    """OpenRLHF's per-parameter ``model.load_weights`` calls are collected and loaded in
    one ``reload_weights`` at the parameter marked last (``empty_cache=True``)."""
    import torch

    from vllm_rl.integrations.openrlhf.worker import OpenRLHFRLWorkerExtension

    loaded, reloads = [], []

    class Model:
        def load_weights(self, weights):
            loaded.extend(weights)

    class Worker(OpenRLHFRLWorkerExtension):
        def reload_weights(self, weights_iterator):
            reloads.append(list(weights_iterator))

    worker = Worker.__new__(Worker)
    worker.model_runner = type("Runner", (), {})()
    worker.model_runner.model = model = Model()

    def receive(name, dtype, shape, empty_cache=False):   # WorkerWrap's last line
        worker.model_runner.model.load_weights(weights=[(name, torch.zeros(shape, dtype=dtype))])

    worker._collecting(receive, "a", torch.float32, (2,), empty_cache=False)
    worker._collecting(receive, "b", torch.float32, (3,), empty_cache=True)
    assert loaded == [] and worker.model_runner.model is model
    assert [[n for n, _ in r] for r in reloads] == [["a", "b"]]
    assert worker.vllm_rl_flush_weights() == 0


STUB = {
    "flash_attn/__init__.py": "",
    "flash_attn/bert_padding.py": "index_first_axis = pad_input = rearrange = unpad_input = None\n",
    "flash_attn/utils/__init__.py": "",
    "flash_attn/utils/distributed.py": "all_gather = None\n",
}

SCRIPT = r'''
import io, json, sys, torch
from contextlib import redirect_stdout
from types import SimpleNamespace as NS
from vllm_rl.integrations.openrlhf.launcher import main
from vllm_rl.integrations.openrlhf.actor import RLActorClass

out = io.StringIO()
with redirect_stdout(out):
    code = main(["--help"])              # OpenRLHF's own train_ppo_ray parser
assert code == 0, code
assert "--vllm.num_engines" in out.getvalue() and "--rollout.n_samples_per_prompt" in out.getvalue()
from openrlhf.trainer.ray import vllm_engine
assert isinstance(vllm_engine.RolloutRayActor, RLActorClass)
from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker
from openrlhf.trainer.ppo_utils.experience import Experience
assert getattr(RemoteExperienceMaker.compute_advantages_and_returns, "__vllm_rl_wrapped__")
# a Ray worker's setup hook with partial rollouts on: OpenRLHF's own trainer module gets
# the partial generator (its PPOTrainer still builds SamplesGenerator by name) and the
# checkpoint hooks
from vllm_rl.integrations.openrlhf.launcher import setup_worker
from vllm_rl.integrations.openrlhf.partial import RLSamplesGenerator
setup_worker({"partial": {"over": 2}})
import openrlhf.trainer.ppo_trainer as ppo_trainer
assert ppo_trainer.SamplesGenerator is RLSamplesGenerator
assert getattr(ppo_trainer.BasePPOTrainer.save_logs_and_checkpoints, "__vllm_rl_wrapped__")

data = torch.load(sys.argv[1], weights_only=False)
n = data["n"]
result = {}
for estimator in ("group_norm", "rloo", "reinforce_baseline"):
    args = NS(rollout=NS(n_samples_per_prompt=n, max_new_tokens=96),
              algo=NS(advantage=NS(estimator=estimator, gamma=1.0, lambd=1.0, no_std_norm=False)),
              reward=NS(clip_range=None, overlong_buffer_len=None, stop_properly_penalty_coef=None),
              data=NS(max_len=512))
    maker = RemoteExperienceMaker.__new__(RemoteExperienceMaker)
    maker.strategy, maker.args, maker.advantage_estimator = NS(args=args), args, estimator
    maker.kl_ctl = NS(value=0.0)
    samples = torch.load(sys.argv[1], weights_only=False)["experiences"]
    for i, e in enumerate(samples):
        e.index = [i]
        e.rewards = torch.tensor([data["rewards"][i]])
        e.kl = torch.zeros_like(e.action_mask, dtype=torch.float32)
    # micro-batches of 3 (not aligned with the groups of n), as split_rollout_samples makes
    batches = [Experience.concat_experiences(samples[i:i + 3], 0)
               for i in range(0, len(samples), 3)]
    batches = maker.compute_advantages_and_returns(batches)
    out = {}
    for b in batches:
        for row, i in enumerate(b.index):
            mask = b.action_mask[row].bool()
            adv = b.advantages[row]
            out[i] = float(adv[mask][-1]) if mask.any() else float(adv.abs().sum())
    result[estimator] = [out[i] for i in range(len(samples))]
print("RESULT " + json.dumps(result))
'''


def _kept_only(rewards, keep, weight, n, estimator):
    """The estimator over each group's kept samples, times the weight (left-out: 0)."""
    import torch

    out = []
    for g in range(len(rewards) // n):
        r = torch.tensor(rewards[g * n:(g + 1) * n], dtype=torch.float64)
        k = torch.tensor(keep[g * n:(g + 1) * n], dtype=torch.bool)
        kr = r[k]
        for i in range(n):
            w = weight[g * n + i]
            if not k[i]:
                out.append(0.0)
            elif estimator == "reinforce_baseline":
                out.append(None)        # then normalised over the batch: checked separately
            elif len(kr) < 2:
                out.append(0.0)
            elif estimator == "rloo":
                out.append(float((r[i] - (kr.sum() - r[i]) / (len(kr) - 1)) * w))
            else:
                out.append(float((r[i] - kr.mean()) / (kr.std() + 1e-9) * w))
    return out


def test_launcher_runs_train_ppo_ray_and_records_reach_the_advantages(step):
    """In a subprocess (flash_attn stubbed): the launcher runs OpenRLHF's own
    train_ppo_ray parser with its patches in place; the workers' setup hook with partial
    rollouts puts the partial generator into OpenRLHF's own trainer module; OpenRLHF's
    compute_advantages_and_returns, wrapped, gives each kept sample the kept-only
    group estimator times its weight, and the left-out ones nothing."""
    import torch

    stub = step["dir"] / "stub"
    for rel, text in STUB.items():
        (stub / rel).parent.mkdir(parents=True, exist_ok=True)
        (stub / rel).write_text(text)
    experiences = copy.deepcopy(step["experiences"])
    for g in range(len(experiences) // N):   # a DUET-like 1/eps weight on one kept sample
        kept = [e for e in experiences[g * N:(g + 1) * N] if float(e.info["vllm_rl/keep"])]
        if kept:
            kept[0].info["vllm_rl/weight"] = torch.tensor([20.0])
    # fake rewards with spread inside each group (no reward model here)
    rewards = [float((i * 7) % 3) + 0.25 * (i % 2) for i in range(len(experiences))]
    path = step["dir"] / "experiences.pt"
    torch.save({"experiences": experiences, "rewards": rewards, "n": N}, path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(stub), *filter(None, [os.environ.get("PYTHONPATH")])])}
    env.pop("VLLM_RL_OPENRLHF", None)
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(SCRIPT), str(path)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")][-1]
    result = json.loads(line[len("RESULT "):])
    keep = [float(e.info["vllm_rl/keep"]) for e in experiences]
    weight = [float(e.info["vllm_rl/weight"]) for e in experiences]
    for estimator in ("group_norm", "rloo"):
        want = _kept_only(rewards, keep, weight, N, estimator)
        assert result[estimator] == pytest.approx(want, abs=1e-4), estimator
    # reinforce_baseline: kept-mean baseline, then OpenRLHF's normalisation over the
    # batch's action tokens (left-out samples have none), then the weight
    lengths = [int(e.action_mask.sum()) for e in experiences]
    base = []
    for g in range(len(rewards) // N):
        members = [i for i in range(g * N, (g + 1) * N) if keep[i]]
        kept_mean = sum(rewards[i] for i in members) / max(len(members), 1)
        base += [rewards[i] - kept_mean for i in range(g * N, (g + 1) * N)]
    tokens = sum(lengths)
    mean = sum(a * n for a, n in zip(base, lengths)) / tokens
    var = sum((a - mean) ** 2 * n for a, n in zip(base, lengths)) / tokens
    want = [((a - mean) / max(var, 1e-8) ** 0.5) * w if k else 0.0
            for a, w, k in zip(base, weight, keep)]
    assert result["reinforce_baseline"] == pytest.approx(want, abs=1e-4)


FAST_SLOW = r'''
import json, os

from vllm_rl.integrations.common.policy import StaticPolicy

FAST = set(json.loads(os.environ["VLLM_RL_TEST_FAST"]))


class FastSlow(StaticPolicy):
    """DUET's gate at 8 tokens, keep chance 1e-6, on the FAST problems (their groups end
    within a few tokens); the others plain (they run to their natural end)."""

    def flags(self, sample):
        out = super().flags(sample)
        if out is not None and sample.problem_id in FAST:
            out["duet"] = {"k1": 4, "k2": 4, "grace": 4, "poll": 4, "eps": 1e-6}
        return out
'''


RAY_SCRIPT = r'''
import json, sys
from types import SimpleNamespace as NS

if __name__ == "__main__":
    import ray
    from vllm_rl.integrations.openrlhf.launcher import patch, ray_init
    replaced = patch()                  # settings from VLLM_RL_OPENRLHF, read here
    ray_init(replaced.settings)(num_cpus=2, num_gpus=1, include_dashboard=False)  # a fake GPU

    @ray.remote(num_cpus=0)
    def worker_side():                  # what the job's setup hook did in a Ray worker
        from vllm_rl.integrations.common.hooks import _after
        return sorted(_after.hooks)

    hooks = ray.get(worker_side.remote())
    from openrlhf.trainer.ray.vllm_engine import create_vllm_engines
    from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator
    from transformers import AutoTokenizer
    from vllm_rl.integrations.common.partial import PartialConfig
    from vllm_rl.integrations.openrlhf.partial import RLSamplesGenerator
    from vllm_rl.task import MODEL_PATH

    stock_prompts, prompts = json.loads(sys.argv[1]), json.loads(sys.argv[2])
    n = int(sys.argv[3])
    engines = create_vllm_engines(1, 1, str(MODEL_PATH), 0, False, True, True, 512,
                                  gpu_memory_utilization=None)
    engine = engines[0]
    tokenizer = AutoTokenizer.from_pretrained(str(MODEL_PATH))
    args = NS(algo=NS(advantage=NS(is_correction_level="token"), dynamic_filtering_enable=False),
              rollout=NS(n_samples_per_prompt=n, batch_size=len(prompts[0])),
              vllm=NS(enable_sleep=False))

    # OpenRLHF's own generator, one rollout
    gen = SamplesGenerator.__new__(SamplesGenerator)
    gen.args, gen.tokenizer, gen.vllm_engines = args, tokenizer, engines
    batches = iter([(None, stock_prompts, ["a", "b", "c"], [None] * 3)])
    exps, consumed, _ = gen._generate_vllm(batches, 3, False, max_new_tokens=64, max_len=512,
                                           temperature=1.0)
    ray.get(engine.pause_generation.remote())
    ray.get(engine.resume_generation.remote())
    ray.get(engine.reset_prefix_cache.remote())
    stock = {"consumed": consumed,
             "samples": [{"keep": float(e.info["vllm_rl/keep"]),
                          "weight": float(e.info["vllm_rl/weight"]),
                          "mask": int(e.action_mask.sum()), "prompt": e.prompts[0]}
                         for e in exps],
             "problems": ray.get(engine.das_stats.remote())["problems"],
             "unfinished": ray.get(engine.get_num_unfinished_requests.remote()),
             "actor": type(engine).__name__}

    # partial rollouts: two steps of the launcher's generator
    batches = [(None, p, [str(i) for i in range(len(p))], [None] * len(p)) for p in prompts]
    gen = RLSamplesGenerator(strategy=NS(args=args), prompts_dataloader=batches,
                             eval_dataloader=None, tokenizer=tokenizer, vllm_engines=engines)
    seen = []
    experiences_of = gen._rl_experiences

    def spy(groups, kwargs):
        seen.append([[{"tokens": p.token_ids, "logprobs": p.logprobs,
                       "info": p.info.to_json()} for p in g.ended] for g in groups])
        return experiences_of(groups, kwargs)

    gen._rl_experiences = spy
    steps, failed = [], {}
    for step in range(2):
        if step == 1:
            gen.rl_partial = PartialConfig(over=1.0)     # step 2 awaits every group
            # a step that fails once its responses are back (the experience maker
            # raising): the carried samples went to the actor and came back, and the
            # buffer is as it was, so the next step sends them all again
            before = json.dumps(gen.state_dict()["buffer"])

            def broken(groups, kwargs):
                raise RuntimeError("the experience maker failed")

            gen._rl_experiences = broken
            try:
                gen._generate_vllm(iter([(None, [], [], [])]), 0, False, max_new_tokens=96,
                                   max_len=512, min_new_tokens=40, temperature=1.0)
            except RuntimeError as e:
                failed = {"error": str(e),
                          "buffer_same": json.dumps(gen.state_dict()["buffer"]) == before}
            gen._rl_experiences = spy
        # min_new_tokens: the plain samples run at least 40 tokens, the gated ones end
        # at 8 whatever it says, so the plain ones are generating when the step ends
        exps, _, consumed, _ = gen.generate_samples(max_new_tokens=96, max_len=512,
                                                    min_new_tokens=40, temperature=1.0)
        state = json.loads(json.dumps(gen.state_dict()))
        steps.append({"consumed": consumed, "groups": seen[-1],
                      "experiences": [{"keep": float(e.info["vllm_rl/keep"]),
                                       "mask": int(e.action_mask.sum()),
                                       "carried_share":
                                           float(e.info["vllm_rl/diag/carried_share"])}
                                      for e in exps],
                      "buffer": state["buffer"]["groups"]})
    print("RESULT " + json.dumps({
        "hooks": hooks, "stock": stock, "steps": steps, "failed": failed,
        "retry_step": gen.rl_step,
        "unfinished": ray.get(engine.get_num_unfinished_requests.remote())}))
    ray.shutdown()
'''


@pytest.fixture(scope="module")
def ray_run(tmp_path_factory):
    """The production path in a subprocess, once: a Ray cluster declaring one (fake) GPU,
    so OpenRLHF's own placement group is created; the launcher's ``ray.init`` gives the
    job its setup hook; ``create_vllm_engines`` builds our actor as a real Ray actor in
    its own worker (settings from the driver's environment: DAS, DARTS, partial
    rollouts, and a policy putting DUET's gate on the ``FAST`` problems); then OpenRLHF's
    ``SamplesGenerator._generate_vllm`` on three prompts, and two steps of
    :class:`RLSamplesGenerator` on four prompts each."""
    from vllm_rl.integrations.openrlhf.actor import problem_id
    from vllm_rl.task import heldout_prompts

    path = tmp_path_factory.mktemp("ray")
    (path / "fast_slow.py").write_text(FAST_SLOW)
    script = path / "ray_rollout.py"
    script.write_text(RAY_SCRIPT)
    held = heldout_prompts(11)
    first, second, stock = held[:4], held[4:8], held[8:]
    settings = {**SETTINGS, "policy": "fast_slow.FastSlow", "partial": {"over": 2.0}}
    env = {**os.environ, "VLLM_RL_OPENRLHF": json.dumps(settings),
           "VLLM_RL_TEST_FAST": json.dumps([problem_id(p) for p in first[:2] + second[:2]]),
           "PYTHONPATH": os.pathsep.join([str(path),
                                          *filter(None, [os.environ.get("PYTHONPATH")])])}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run([sys.executable, str(script), json.dumps(stock),
                           json.dumps([first, second]), str(N)],
                          env=env, cwd=path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-5000:])
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


def test_real_ray_actor_through_openrlhfs_samples_generator(ray_run):
    """OpenRLHF's ``SamplesGenerator._generate_vllm`` dispatches to the real Ray actor with
    ``ray.wait`` / ``ray.get`` and makes the experiences, marked per group; a Ray worker
    of the job has OpenRLHF's trainer side hooked (the experience maker, and with
    ``partial`` the generator)."""
    result = ray_run["stock"]
    assert "openrlhf.trainer.ppo_trainer" in ray_run["hooks"]
    assert "openrlhf.trainer.ppo_utils.experience_maker" in ray_run["hooks"]
    assert result["consumed"] == 3 and result["unfinished"] == 0
    assert result["problems"] == 3                   # one DAS tree per prompt
    samples = result["samples"]
    assert len(samples) == 3 * N
    for prompt in {s["prompt"] for s in samples}:
        group = [s for s in samples if s["prompt"] == prompt]
        assert len(group) == N
        assert sum(s["keep"] for s in group) <= M
        for s in group:
            assert (s["mask"] > 0) == (s["keep"] == 1.0) and s["weight"] == s["keep"]


def test_partial_rollouts_through_a_real_ray_actor(ray_run):
    """Partial rollouts on the same actor: :class:`RLSamplesGenerator` runs OpenRLHF's
    ``generate_samples`` twice.  Step 1: the two DUET-gated groups end within a few
    tokens, the generator ends the step on the actor, the other two come back carried
    and stay in the buffer (plain JSON).  Then a step fails once its responses are back:
    the buffer is as it was (all or nothing).  Step 3 (every group awaited): the carried
    samples continue through OpenRLHF's executor and their groups train whole (DARTS's
    shortest-M across the two steps), each continued sample's record covering the whole
    sample, its first tokens and logprobs step 1's."""
    one, two = ray_run["steps"]
    retry = ray_run["retry_step"]                 # step 2 ran after a step that failed
    assert ray_run["failed"] == {"error": "the experience maker failed", "buffer_same": True}
    carried = [p for g in one["buffer"] for p in g["carried"]]
    assert carried, "the plain groups were still generating: carried"
    assert all(p["info"]["reason"] == "carried" and p["info"]["step"] == 1 for p in carried)
    assert len(one["experiences"]) == N * len(one["groups"]) and len(one["groups"]) >= 2
    assert len(one["groups"]) + len(one["buffer"]) == 4
    assert not one["buffer"] or two["consumed"] == 4
    assert not two["buffer"] and ray_run["unfinished"] == 0
    trained = [p for g in two["groups"] for p in g]
    assert len(trained) == N * len(two["groups"])
    # OpenRLHF serves one training chunk (batch_size x n) per call, the rest the next
    assert len(two["experiences"]) == min(len(trained), 4 * N)
    for part in carried:
        # siblings may share their first tokens: the one continued from this part
        match = [p for p in trained if p["tokens"][:len(part["token_ids"])] == part["token_ids"]
                 and p["info"].get("start_step") == 1
                 and p["info"].get("prior_tokens") == len(part["token_ids"])]
        assert match, "a continued sample starts with its carried tokens"
        info = match[0]["info"]
        assert info["step"] == retry == 3 and info["steps_crossed"] == retry - 1
        assert info["length"] == len(match[0]["tokens"])
        assert match[0]["logprobs"][:len(part["logprobs"])] == pytest.approx(part["logprobs"])
    continued = [p for p in trained if p["info"].get("start_step") == 1]
    for g in two["groups"]:                    # DARTS: the M shortest of a continued group
        members = [p for p in g if p["info"].get("start_step") == 1]
        if len(members) == N:
            assert sum(bool(p["info"].get("selected")) for p in members) <= M
    assert continued and max(e["carried_share"] for e in two["experiences"]) > 0
