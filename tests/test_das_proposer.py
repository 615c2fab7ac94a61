"""DASProposer's bookkeeping against a stand-in model runner (the engine tests cover vLLM).

The runner here has only what the proposer reads: ``input_batch.req_ids`` /
``num_prompt_tokens``, ``requests[rid].sampling_params`` / ``prompt_token_ids``, and the
step's ``scheduled_spec_decode_tokens``.
"""
from types import SimpleNamespace

import numpy as np

from vllm_rl import rl_params
from vllm_rl.spec.config import CONFIG_KEY, PROPOSER
from vllm_rl.spec.proposer import DASProposer

EOS = 0
PROMPT = [7, 8, 9]


def _proposer(**cfg):
    spec = SimpleNamespace(method="custom_class", model=PROPOSER, num_speculative_tokens=8)
    return DASProposer(SimpleNamespace(speculative_config=spec,
                                       additional_config={CONFIG_KEY: cfg},
                                       model_config=SimpleNamespace(max_model_len=512)))


def _request(das=None, max_tokens=64):
    params = SimpleNamespace(extra_args=rl_params(das=das) if das is not None else None,
                             max_tokens=max_tokens, all_stop_token_ids={EOS},
                             eos_token_id=EOS, ignore_eos=False)
    return SimpleNamespace(sampling_params=params, prompt_token_ids=list(PROMPT))


class Runner:
    def __init__(self):
        self.requests, self.rows = {}, []
        self.tokens = {}

    def add(self, rid, cached):
        self.requests[rid] = cached
        self.rows.append(rid)
        self.tokens[rid] = list(cached.prompt_token_ids)

    def drop(self, rid):
        self.requests.pop(rid)
        self.rows.remove(rid)

    def step(self, proposer, sampled: dict, drafts: dict | None = None):
        """One decode step: ``sampled[rid]`` are the tokens each row got."""
        for rid, toks in sampled.items():
            self.tokens[rid] += toks
        self.input_batch = SimpleNamespace(
            req_ids=list(self.rows),
            num_prompt_tokens=np.array([len(PROMPT)] * len(self.rows)))
        n = np.array([len(self.tokens[r]) for r in self.rows])
        buf = np.zeros((max(len(self.rows), 1), 600), dtype=np.int32)
        for i, r in enumerate(self.rows):
            buf[i, :n[i]] = self.tokens[r]
        proposer.bind_step(self, SimpleNamespace(scheduled_spec_decode_tokens=drafts or {}))
        out = proposer.propose([sampled.get(r, []) for r in self.rows], n, buf)
        return dict(zip(self.rows, out))


def test_only_das_rows_feed_trees_and_get_drafts():
    p, runner = _proposer(), Runner()
    runner.add("plain", _request())
    runner.add("das", _request({"problem_id": "P", "policy": "fixed"}))
    drafts = runner.step(p, {"plain": [5], "das": [5]})
    assert drafts["plain"] == [] and p.requests["plain"] is None
    assert list(p.store.problems) == ["P"]
    assert list(p.store.sequences("P")) == [PROMPT + [5]]        # prompt tail + output


def test_a_prebuilt_rollout_is_drafted_within_budget_and_max_tokens():
    p, runner = _proposer(), Runner()
    rollout = [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22]
    p.prebuild("P", [rollout + [EOS]], PROMPT)
    runner.add("r", _request({"problem_id": "P", "policy": "fixed"}, max_tokens=6))
    drafts = runner.step(p, {"r": [11]})
    # 2b = 8 tokens, but max_tokens 6 leaves 6 - 1 generated - 1 bonus = 4 to draft
    assert drafts["r"] == [12, 13, 14, 15]


def test_accepted_drafts_are_counted_per_step_and_problem():
    p, runner = _proposer(), Runner()
    p.prebuild("P", [[11, 12, 13, 14, 15, 16, 17, 18, 19, 20]], PROMPT)
    runner.add("r", _request({"problem_id": "P", "policy": "fixed"}))
    drafts = runner.step(p, {"r": [11]})
    assert drafts["r"][:3] == [12, 13, 14]
    runner.step(p, {"r": [12, 13, 99]}, drafts={"r": drafts["r"]})   # 2 accepted
    stats = p.stats()
    assert stats["per_step"] == [[1, len(drafts["r"]), 2]]
    assert stats["per_problem"]["P"]["accepted"] == 2


def test_a_natural_end_seals_at_once_and_ends_the_round():
    p, runner = _proposer(), Runner()
    runner.add("r", _request({"problem_id": "P"}))
    runner.step(p, {"r": [5]})
    runner.step(p, {"r": [6, EOS, 4]})               # tokens after EOS are not the sample's
    assert p.store.problems["P"].growing == set()
    assert list(p.store.sequences("P")) == [PROMPT + [5, 6, EOS]]
    assert p.store.lengths("P") == [3]
    assert p.stats()["n_fwd_recent_rounds"] == [2] and p.rounds == 1


def test_a_cut_short_rollout_keeps_its_tokens_not_its_length():
    p, runner = _proposer(), Runner()
    runner.add("r", _request({"problem_id": "P"}))
    runner.add("s", _request({"problem_id": "P"}))
    runner.step(p, {"r": [5], "s": [5]})
    runner.drop("r")                                  # cancelled by the scheduler
    runner.step(p, {"s": [EOS]})
    assert sorted(map(len, p.store.sequences("P"))) == [4, 5]
    assert p.store.lengths("P") == [2]                # only the natural end


def test_a_reused_request_id_starts_a_new_rollout():
    p, runner = _proposer(), Runner()
    runner.add("r", _request({"problem_id": "P"}))
    runner.step(p, {"r": [5, 6]})
    runner.drop("r")
    runner.add("r", _request({"problem_id": "Q"}))    # same id, a new request
    runner.step(p, {"r": [8]})
    assert list(p.store.sequences("P")) == [PROMPT + [5, 6]]
    assert list(p.store.sequences("Q")) == [PROMPT + [8]]
