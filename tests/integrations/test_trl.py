"""vllm_rl with TRL (the real ``trl`` package, pinned by the install) on the CPU.

In-process GRPO through ``rollout_func`` with every technique's record in the loss, TRL's
colocated mode on our engine, TRL's server-mode client against ``vllm-rl serve``, and
weight reloads that keep the RL state.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from vllm_rl import Reason
from vllm_rl.compat import vllm_version_shim

vllm_version_shim()
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

MARKER = r"\\boxed\{[^}]*\}"


def _initial_state():
    from transformers import AutoModelForCausalLM

    from vllm_rl.task import MODEL_PATH

    return AutoModelForCausalLM.from_pretrained(MODEL_PATH).state_dict()


def _greedy(llm, prompts):
    from vllm import SamplingParams

    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=24), use_tqdm=False)
    return [o.outputs[0].text for o in outs]


def _grpo_trainer(cls, rollout, prompts, tag, steps, batch, max_tokens, m, **config):
    """A TRL GRPO trainer of class ``cls`` on the embedded model, CPU, no saving (unless
    ``config`` says otherwise), the task reward masked for samples outside the loss,
    rollouts from ``rollout``."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig

    from vllm_rl.integrations.trl.rollout import masked_reward
    from vllm_rl.task import MODEL_PATH, reward

    def task_reward(prompts, completions, **_):
        return [reward(p, c) for p, c in zip(prompts, completions)]

    config = GRPOConfig(**{
        "output_dir": f"/tmp/vllm-rl-trl-{tag}", "max_steps": steps,
        "per_device_train_batch_size": batch, "num_generations": m, "learning_rate": 1e-4,
        "beta": 0.0, "max_completion_length": max_tokens, "report_to": [],
        "save_strategy": "no", "use_cpu": True, "bf16": False, "logging_steps": 1,
        "disable_tqdm": True, "shuffle_dataset": False, **config})
    return cls(model=AutoModelForCausalLM.from_pretrained(MODEL_PATH),
               reward_funcs=[masked_reward(task_reward)], args=config,
               train_dataset=Dataset.from_dict({"prompt": prompts}),
               processing_class=AutoTokenizer.from_pretrained(MODEL_PATH), rollout_func=rollout)


def test_load_weights_keeps_the_rl_state(das_llm, prompts):
    """Weights reloaded into a running RL engine change its tokens, and leave the DAS
    trees and the ARRoL head as they were; loading the originals back restores the tokens."""
    from vllm_rl.weights import load_weights

    initial = _initial_state()
    das_llm.das_prebuild("reload-check", [[1, 2, 3, 4, 5]] * 2)
    trees, head = das_llm.das_stats()["problems"], das_llm.arrol_info()["version"]
    before = _greedy(das_llm, prompts[:4])
    try:
        load_weights(das_llm, {k: v * 0.5 if "mlp" in k else v for k, v in initial.items()})
        changed = _greedy(das_llm, prompts[:4])
        assert changed != before
        assert das_llm.das_stats()["problems"] == trees
        assert das_llm.arrol_info()["version"] == head
    finally:
        das_llm.load_weights(initial)
        das_llm.das_clear("reload-check")
    assert _greedy(das_llm, prompts[:4]) == before


def test_rollout_func_trains_with_the_records_in_the_loss(das_llm):
    """TRL's GRPOTrainer, rollouts from the RL engine through rollout_func with all four
    techniques: M of M' per prompt come back, masked samples leave the loss (zero
    advantage, env_mask 0), the weights are loaded into the engine every step."""
    from vllm_rl.integrations.trl.rollout import RolloutFunc
    from vllm_rl.integrations.trl.trainer import RLGRPOTrainer
    from vllm_rl.outcome import RolloutInfo
    from vllm_rl.task import train_prompts

    m, m_prime = 4, 8
    flags = {"darts": {"mode": "shortest"},
             "duet": {"pattern": MARKER, "k1": 16, "k2": 96, "grace": 8, "eps": 0.05},
             "das": {}, "arrol": {"l_detect": 16}}
    seen = []

    class Checked(RolloutFunc):
        def __call__(self, prompts, trainer):
            result = super().__call__(prompts, trainer)
            for mask, weight, ids in zip(result["env_mask"], result["vllm_rl_weight"],
                                         result["completion_ids"]):
                assert len(mask) == len(ids) and set(mask) <= {0, 1}
                assert (weight > 0) == all(mask)
            self.records = [RolloutInfo.decode(r) for r in result["vllm_rl_record"]]
            self.history.append(self.last.infos)
            return result

    class Capture(RLGRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            out = super()._generate_and_score_completions(inputs)
            seen.append((list(rollout.last_weights), out["advantages"].clone(), rollout.records))
            return out

    rollout = Checked(das_llm, flags, redundant=m_prime, max_tokens=128, seed=3)
    rollout.history = []

    trainer = _grpo_trainer(Capture, rollout, train_prompts(8), "test", steps=2, batch=2 * m,
                            max_tokens=128, m=m)
    try:
        trainer.train()
    finally:
        das_llm.load_weights(_initial_state())
    assert rollout.loaded_step == 1, "the step-1 weights went into the engine"
    assert len(seen) == 2
    for weights, advantages, infos in seen:
        assert len(weights) == len(advantages) == len(infos) and len(weights) % 2 == 0
        assert len(weights) // 2 >= m          # M rows per prompt, more for eps-kept
        for w, a, info in zip(weights, advantages.tolist(), infos):
            if info is None:                   # a padding row
                assert w == 0.0 and a == 0.0
                continue
            assert w == (0.0 if info.selected is False else info.weight)
            if w == 0:
                assert a == 0.0, "a masked sample has no advantage"
            assert info.reason is not Reason.DARTS_CANCELLED or w == 0
    assert all(len(group) == m_prime for step in rollout.history for group in step)
    # the check above is not vacuous: some sample was cancelled (in either step; which
    # ones depends on sampling, and an async engine's batches on timing, as stock vLLM's)
    assert any(i.reason is Reason.DARTS_CANCELLED
               for step in rollout.history for g in step for i in g)


COLOCATE = textwrap.dedent('''
    import os
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    if __name__ == "__main__":
        import torch
        from vllm_rl.integrations.trl.colocate import ColocateLLM, use_vllm_rl
        from datasets import Dataset
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from trl import GRPOConfig, GRPOTrainer
        from vllm_rl.task import MODEL_PATH, reward, train_prompts

        use_vllm_rl({"duet": {"pattern": r"%s", "k1": 16, "k2": 32, "grace": 8, "eps": 0.5}},
                    max_model_len=512)
        cfg = GRPOConfig(output_dir="/tmp/vllm-rl-trl-colocate", max_steps=2,
                         per_device_train_batch_size=8, num_generations=4, learning_rate=1e-3,
                         beta=0.0, max_completion_length=96, report_to=[], save_strategy="no",
                         use_cpu=True, bf16=False, use_vllm=True, vllm_mode="colocate",
                         vllm_max_model_length=512, disable_tqdm=True)
        r = lambda prompts, completions, **kw: [reward(p, c) for p, c in zip(prompts, completions)]
        trainer = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(MODEL_PATH),
                              reward_funcs=[r], args=cfg, processing_class=AutoTokenizer.from_pretrained(MODEL_PATH),
                              train_dataset=Dataset.from_dict({"prompt": train_prompts(16)}))
        trainer.train()
        llm = trainer.vllm_generation.llm
        assert isinstance(llm, ColocateLLM), type(llm)
        trainer.vllm_generation.sync_weights()      # TRL's own weight sync, one more time
        engine = dict(llm._runner_model().named_parameters())["model.embed_tokens.weight"]
        policy = trainer.model.model.embed_tokens.weight
        assert torch.equal(engine.detach().cpu(), policy.detach().cpu().to(engine.dtype)), "synced"
        print("REASONS", sorted({i.reason.value for i in llm.last_infos}))
''') % MARKER


def test_colocate_mode_runs_trl_on_our_engine(tmp_path):
    """TRL's colocated vLLM is our engine (use_vllm_rl): flags on every request, TRL's own
    per-parameter weight sync lands in the engine (vLLM 0.32 needs it batched)."""
    script = tmp_path / "colocate.py"
    script.write_text(COLOCATE)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "VLLM_CONFIGURE_LOGGING": "0"})
    assert done.returncode == 0, done.stderr[-3000:]
    reasons = eval(done.stdout.split("REASONS", 1)[1].strip())
    assert set(reasons) & {"duet_trimmed", "duet_aborted"}, reasons


def test_server_mode_client_keeps_the_records():
    """TRL's VLLMClient against `vllm-rl serve`: flags through generation_kwargs'
    vllm_xargs, and RLVLLMClient keeps one record per completion."""
    from server_fixture import shared_server

    from vllm_rl import rl_xargs
    from vllm_rl.integrations.trl.client import RLVLLMClient
    from vllm_rl.task import heldout_prompts

    client = RLVLLMClient(base_url=shared_server(), connection_timeout=60)
    xargs = rl_xargs(group={"size": 2}, darts={"mode": "shortest"})
    out = client.generate(heldout_prompts(3), n=6, max_tokens=128, temperature=1.0,
                          generation_kwargs={"vllm_xargs": xargs, "seed": 1})
    assert len(out["records"]) == len(out["completion_ids"]) == 18
    for info, ids in zip(out["records"], out["completion_ids"]):
        assert info.length == len(ids)
    assert any(i.reason is Reason.DARTS_CANCELLED for i in out["records"])


def test_duet_baseline_includes_aborted_samples_in_trl(das_llm):
    """DUET alone through TRL: an aborted sample's reward is in its group's mean and std
    (Alg. A.10 l.38), its advantage is 0 and it is masked (l.39-40), an eps-kept one's
    advantage carries 1/eps: TRL's advantages equal the shared group_advantages."""
    from vllm_rl.integrations.common.advantages import group_advantages
    from vllm_rl.integrations.trl.rollout import RolloutFunc
    from vllm_rl.integrations.trl.trainer import RLGRPOTrainer
    from vllm_rl.task import reward, train_prompts

    m = 4
    flags = {"duet": {"pattern": MARKER, "k1": 16, "k2": 24, "grace": 8, "eps": 0.5}}
    seen = []

    class Capture(RLGRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            out = super()._generate_and_score_completions(inputs)
            seen.append((out["advantages"].clone(), list(rollout.last_marks),
                         list(rollout.last_texts),
                         [p for p in rollout.last.prompts for _ in range(m)]))
            return out

    rollout = RolloutFunc(das_llm, flags, max_tokens=96, seed=5)

    trainer = _grpo_trainer(Capture, rollout, train_prompts(12)[8:12], "duet", steps=1,
                            batch=4 * m, max_tokens=96, m=m)
    try:
        trainer.train()
    finally:
        das_llm.load_weights(_initial_state())
    advantages, marks, texts, prompts = seen[0]
    assert all(mk.baseline for mk in marks)                        # DUET: every rollout
    rewards = [reward(p, t) for p, t in zip(prompts, texts)]
    groups = [i // m for i in range(len(marks))]
    expected = group_advantages(rewards, marks, groups)
    assert advantages.tolist() == pytest.approx(expected, abs=1e-4)
    assert any(not mk.keep for mk in marks), "some samples were aborted"
    assert all(a == 0.0 for a, mk in zip(advantages.tolist(), marks) if not mk.keep)
    assert trainer.diagnostics["loss_samples"] == sum(mk.keep for mk in marks)


def test_every_sample_the_records_keep_reaches_trls_loss(das_llm):
    """DARTS (early stop, M = 4 of 8) with DUET's gate at eps = 0.5 inside it: a group
    holds its M selected and, beside them, the eps-kept samples (the composition rule),
    more than TRL's num_generations.  RLGRPOTrainer gives each prompt the rows its largest
    group needs: every sample the records keep reaches the loss with its weight, every
    sample they put in the baseline is in it, no eps-kept sample is dropped, and TRL's
    advantages equal the shared group_advantages over the returned rows."""
    from vllm_rl.integrations.common.advantages import group_advantages
    from vllm_rl.integrations.trl.rollout import RolloutFunc
    from vllm_rl.integrations.trl.trainer import RLGRPOTrainer
    from vllm_rl.task import reward, train_prompts

    m = 4
    flags = {"darts": {"mode": "shortest"},
             "duet": {"pattern": MARKER, "k1": 8, "k2": 16, "grace": 8, "eps": 0.5}}
    seen = []

    class Capture(RLGRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            out = super()._generate_and_score_completions(inputs)
            seen.append((out["advantages"].clone(), list(rollout.last_marks),
                         list(rollout.last_texts), list(rollout.last_weights),
                         [list(g) for g in rollout.last.marks], list(rollout.last.prompts)))
            return out

    rollout = RolloutFunc(das_llm, flags, redundant=8, max_tokens=96, seed=11)
    trainer = _grpo_trainer(Capture, rollout, train_prompts(16)[:8], "slots", steps=2,
                            batch=4 * m, max_tokens=96, m=m)
    try:
        trainer.train()
    finally:
        das_llm.load_weights(_initial_state())
    overflow = 0
    for advantages, rows, texts, weights, groups, prompts in seen:
        slots = len(rows) // len(prompts)
        assert slots * len(prompts) == len(rows) == len(advantages) == len(weights)
        overflow += slots > m
        for g, (marks, prompt) in enumerate(zip(groups, prompts)):
            mine = rows[g * slots:(g + 1) * slots]
            kept = sorted(mk.weight for mk in marks if mk.keep)
            assert sorted(mk.weight for mk in mine if mk.keep) == kept      # none cut
            assert (sum(mk.baseline for mk in mine) == sum(mk.baseline for mk in marks))
            assert (sum(mk.eps_kept for mk in mine) == sum(mk.eps_kept for mk in marks))
        rewards = [reward(prompts[i // slots], t) for i, t in enumerate(texts)]
        expected = group_advantages(rewards, rows, [i // slots for i in range(len(rows))])
        assert advantages.tolist() == pytest.approx(expected, abs=1e-4)
        assert all(w == (mk.weight if mk.keep else 0.0) for w, mk in zip(weights, rows))
    eps_kept = [mk for step in seen for g in step[4] for mk in g if mk.eps_kept]
    assert eps_kept and all(mk.weight == 2.0 and mk.keep and mk.baseline for mk in eps_kept)
    assert overflow, "a group needed more rows than num_generations (not vacuous)"


def test_duet_allocator_sets_each_prompts_rollouts_and_weights(das_llm):
    """DUET alone through TRL runs its allocator (Thm. 1 / Eq. 4, the paper's default):
    the first step is cold (every prompt M), the second splits the full budget by each
    prompt's running σ̂_obs and L̂ (n in [2, 2M]); each prompt's rows carry Eq. 6's
    weight (1/p_abort)/s_pre, and TRL's advantages are the shared group_advantages over
    the rows, padding rows (a prompt given fewer than the slots) out of everything."""
    from vllm_rl.duet.controller import DuetController
    from vllm_rl.integrations.common.advantages import group_advantages
    from vllm_rl.integrations.trl.rollout import RolloutFunc
    from vllm_rl.integrations.trl.trainer import RLGRPOTrainer
    from vllm_rl.task import reward, train_prompts

    m = 4
    flags = {"duet": {"pattern": MARKER, "k1": 16, "k2": 40, "grace": 8, "eps": 0.5}}
    seen = []

    class Capture(RLGRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            out = super()._generate_and_score_completions(inputs)
            seen.append((out["advantages"].clone(), list(rollout.last_marks),
                         list(rollout.last_texts), list(rollout.last.prompts),
                         list(rollout.last.redundant), dict(rollout._strata)))
            return out

    rollout = RolloutFunc(das_llm, flags, max_tokens=96, seed=23)
    prompts = train_prompts(40)[32:36] * 2          # the same 4 prompts, two steps
    trainer = _grpo_trainer(Capture, rollout, prompts, "alloc", steps=2, batch=4 * m,
                            max_tokens=96, m=m)
    try:
        trainer.train()
    finally:
        das_llm.load_weights(_initial_state())
    assert isinstance(rollout.duet_allocation, DuetController)
    (_, _, _, _, cold, _), step2 = seen
    assert cold == [m] * 4                                   # a cold batch: uniform
    advantages, rows, texts, prompts2, counts, strata = step2
    assert all(2 <= n <= 2 * m for n in counts) and len(strata) == 4
    slots = len(rows) // 4
    assert slots == max(m, max(counts))
    for g, (prompt, n) in enumerate(zip(prompts2, counts)):
        mine = rows[g * slots:(g + 1) * slots]
        assert sum(mk.info is not None for mk in mine) == n     # every rollout returned
        s_pre = strata[rollout.problem_id(prompt)]
        for mk in mine:
            if mk.keep:
                assert mk.weight == pytest.approx(1 / mk.info.keep_prob / s_pre)
    rewards = [reward(prompts2[i // slots], t) for i, t in enumerate(texts)]
    expected = group_advantages(rewards, rows, [i // slots for i in range(len(rows))])
    assert advantages.tolist() == pytest.approx(expected, abs=1e-4)
    assert rollout.duet_allocation.observations(rollout.problem_id(prompts2[0])) >= 1


def test_partial_rollouts_carry_the_tail_across_trl_steps(das_llm, tmp_path):
    """APRIL through TRL: each step trains the groups that complete (some started in an
    earlier step, their records whole), carries the rest; the buffer survives a restart
    in a checkpoint, and a carried group whose prompt left the dataset ends with a
    `stale` record per carried sample, never silently.  The regime log holds every
    returned sample, whole, with its reward (what `vllm-rl advise` reads)."""
    import json

    from vllm_rl.regime import Regime
    from vllm_rl.regime_log import read
    from vllm_rl.task import reward

    from vllm_rl.integrations.common.partial import PartialConfig
    from vllm_rl.outcome import RolloutInfo
    from vllm_rl.integrations.trl.rollout import RolloutFunc
    from vllm_rl.integrations.trl.trainer import RLGRPOTrainer
    from vllm_rl.task import train_prompts

    m = 4
    steps = []

    class Checked(RolloutFunc):
        def __call__(self, prompts, trainer):
            result = super().__call__(prompts, trainer)
            steps.append((self.last, self.buffer.samples(), dict(trainer.diagnostics)))
            for ids, lps, record in zip(result["completion_ids"], result["logprobs"],
                                        result["vllm_rl_record"]):
                assert len(ids) == len(lps)
                if record:
                    info = RolloutInfo.decode(record)
                    assert info.reason is not Reason.CARRIED
                    assert info.length == len(ids), "the record covers the whole sample"
            return result

    log = tmp_path / "regime.jsonl"
    rollout = Checked(das_llm, {}, max_tokens=96, seed=5, partial=PartialConfig(over=2.0),
                      reward=reward, regime_log=log)
    trainer = _grpo_trainer(RLGRPOTrainer, rollout, train_prompts(16), "partial", steps=3,
                            batch=4 * m, max_tokens=96, m=m)
    try:
        trainer.train()
    finally:
        das_llm.load_weights(_initial_state())
    assert len(steps) == 3
    assert sum(carried for _, carried, _ in steps) > 0, "no sample was ever carried"
    for last, _, _ in steps:
        assert last.prompts and all(len(g) == m for g in last.infos)
    crossed = [i for last, _, _ in steps for g in last.infos for i in g if i.steps_crossed]
    assert crossed, "no carried sample finished in a later step"
    for info in crossed:
        assert info.prior_tokens and info.start_step < info.step
    assert "staleness_mean" in trainer.diagnostics
    logged, limit = read(log)
    returned = [i for last, _, _ in steps for g in last.infos for i in g]
    assert limit == 96 and len(logged) == len(returned)
    assert sorted(s.length for s in logged) == sorted(i.length for i in returned)
    assert all(s.reward is not None and not s.ended_early for s in logged)
    assert Regime.of(logged, limit).samples == len(returned)

    # A restart: the buffer goes into a checkpoint as JSON and comes back.
    state = json.loads(json.dumps(rollout.buffer.state_dict()))
    carried = sum(len(g["carried"]) for g in state["groups"])
    if carried:
        resumed = RolloutFunc(das_llm, {}, max_tokens=96, seed=6, partial=True,
                              sync_weights=False)
        resumed.buffer.load_state_dict(state)
        resumed.prepare([p for p in train_prompts(16)[:2] for _ in range(m)], trainer)
        back = [i for g in resumed.last.infos for i in g if i.prior_tokens]
        assert back or resumed.buffer.samples(), "the restored samples went nowhere"
        gone = RolloutFunc(das_llm, {}, max_tokens=96, seed=7, partial=True,
                           sync_weights=False, keep_prompt=lambda prompt: False)
        gone.buffer.load_state_dict(state)
        gone.prepare([p for p in train_prompts(16)[:1] for _ in range(m)], trainer)
        stale = [i for g in gone.last.infos for i in g if i.reason is Reason.STALE]
        assert len(stale) == carried and all(i.weight == 0.0 for i in stale)


def test_partial_rollouts_resume_from_trls_checkpoint(das_llm, tmp_path):
    """A run stopped with samples in the carry buffer and resumed from TRL's own
    checkpoint (``RLGRPOTrainer`` keeps the buffer beside it, ``vllm_rl_carry.json``):
    every group carried at the checkpoint trains in the resumed run (none lost), and no
    group trained before the checkpoint trains again."""
    import json

    from vllm_rl.integrations.common.partial import CHECKPOINT_FILE, PartialConfig
    from vllm_rl.integrations.trl.rollout import RolloutFunc
    from vllm_rl.integrations.trl.trainer import RLGRPOTrainer
    from vllm_rl.task import train_prompts

    m, trained = 4, []

    class Logged(RolloutFunc):
        def __call__(self, prompts, trainer):
            result = super().__call__(prompts, trainer)
            trained.append((self.tag, trainer.state.global_step,
                            [g[0].group_id for g in self.last.infos],
                            [i for g in self.last.infos for i in g]))
            return result

    def run(rollout, tag, steps, **config):
        rollout.tag = tag
        trainer = _grpo_trainer(RLGRPOTrainer, rollout, train_prompts(16), f"resume-{tag}",
                                steps=steps, batch=4 * m, max_tokens=96, m=m,
                                output_dir=str(tmp_path), save_strategy="steps",
                                save_steps=1)
        trainer.train(**config)
        return trainer

    try:
        first = Logged(das_llm, {}, max_tokens=96, seed=5, partial=PartialConfig(over=2.0))
        run(first, "first", 3)
        # the last checkpoint with carried groups (a step whose groups all end at
        # max_tokens in one engine step carries none)
        saved = {c: json.loads((tmp_path / f"checkpoint-{c}" / CHECKPOINT_FILE).read_text())
                 for c in (1, 2, 3)}
        at = max((c for c in saved if saved[c]["groups"]), default=None)
        assert at is not None, "no step carried anything: no buffer to resume"
        resumed = Logged(das_llm, {}, max_tokens=96, seed=6, partial=PartialConfig(over=1.0))
        run(resumed, "resumed", at + 1, resume_from_checkpoint=str(tmp_path / f"checkpoint-{at}"))
    finally:
        das_llm.load_weights(_initial_state())
    carried = {g["group_id"] for g in saved[at]["groups"]}
    before = {gid for tag, step, gids, _ in trained if tag == "first" and step < at
              for gid in gids}
    after = [(gids, infos) for tag, _, gids, infos in trained if tag == "resumed"]
    assert len(after) == 1, "the resumed run runs the step after its checkpoint only"
    (gids, infos) = after[0]
    assert carried <= set(gids), "every carried group trains after the resume"
    assert not before & set(gids), "no group trains twice"
    assert len(gids) == len(set(gids)) and len(resumed.buffer) == 0
    for info in infos:
        if info.group_id in carried:
            assert info.start_step < at and info.reason is not Reason.CARRIED
