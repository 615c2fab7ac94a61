"""DASProposer's bookkeeping against a stand-in model runner (the engine tests cover vLLM).

The runner here has only what the proposer reads: ``input_batch.req_ids`` /
``num_prompt_tokens``, ``requests[rid].sampling_params`` / ``prompt_token_ids``, and the
step's ``scheduled_spec_decode_tokens``.
"""
import copy
from types import SimpleNamespace

import numpy as np

from vllm_rl import rl_params
from vllm_rl.das.config import CONFIG_KEY, PROPOSER
from vllm_rl.das.drafter import DASProposer

EOS = 0
PROMPT = [7, 8, 9]


def _proposer(**cfg):
    # the mechanics below on the trees' raw counts (a one-rollout tree drafts with
    # probability 1); the prior's cut has its own tests (batch_cap="confidence")
    cfg.setdefault("prior", 0.0)
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
        proposer.settle()           # the background feed, as the next step would wait for it
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


def _admitted(p):
    """What the drafter holds for each request it admitted: its state (slot and sequence
    aside, which depend on the order of admissions), its columns, its rollout."""
    from dataclasses import asdict

    S, out = p.slots, {}
    for rid, st in p.requests.items():
        if st is None:
            out[rid] = None
            continue
        state = {k: v for k, v in asdict(st).items() if k not in ("slot", "seq", "slots")}
        cols = {name: getattr(S, name)[st.slot].item()
                for name in ("max_tokens", "budget", "generated", "class_budget", "policy",
                             "rank", "min_prob", "force", "done")}
        rollout = [p.store.problems[st.problem].tree.sequence(st.seq)]
        out[rid] = (state, cols, rollout, st.length_class)
    return out


def test_a_steps_admissions_are_one_batch_equal_to_one_per_step():
    """A step's admissions are written at once (:meth:`RequestBook._admit`): the same
    states, columns, rollouts and stop ids as admitting them one step at a time; a
    reused id among them seals its old request first (its rollout stays in the tree)."""
    reqs = [("a", _request({"problem_id": "P"})),
            ("b", _request({"problem_id": "P", "budget": 1, "policy": "class"})),
            ("plain", _request()),
            ("c", _request({"problem_id": "Q", "force": True}, max_tokens=9)),
            ("d", _request({})),                            # its prompt names its problem
            ("r", _request({"problem_id": "P", "min_prob": 0.3}))]
    reqs[3][1].sampling_params.all_stop_token_ids = {EOS, 42}
    runs = []
    for one_by_one in (True, False):
        p, runner = _proposer(), Runner()
        p.prebuild("P", [[11, 12, EOS], [11, 13, 14, 15, EOS]], PROMPT)
        runner.add("r", _request({"problem_id": "P"}))      # its id is reused below
        runner.step(p, {"r": [5]})
        sampled = {}
        for rid, cached in reqs:
            if rid == "r":              # a new request under the old one's id, same row
                runner.requests[rid], runner.tokens[rid] = cached, list(PROMPT)
            else:
                runner.add(rid, cached)
            sampled[rid] = [6]
            if one_by_one:
                runner.step(p, {k: [] for k in sampled})
        assert len(p.requests) == (len(reqs) if one_by_one else 1)
        if not one_by_one:
            runner.step(p, {k: [] for k in sampled})
        runner.step(p, sampled)
        runs.append((_admitted(p), sorted(p._stop_ids.tolist()), p._forcing,
                     sorted(map(tuple, p.store.sequences("P")))))
    assert runs[0] == runs[1]
    admitted, stops, forcing, rollouts = runs[1]
    assert admitted["plain"] is None and stops == [EOS, 42] and forcing
    assert admitted["c"][1]["force"] and admitted["r"][1]["min_prob"] == 0.3
    assert admitted["b"][1]["budget"] == 1 and admitted["a"][2] == [PROMPT + [6]]
    assert tuple(PROMPT + [5]) in rollouts                 # the old "r", sealed


# ------------------------------------------------ batch_cap="phase" (the H100 table)


def _phase_proposer():
    spec = SimpleNamespace(method="custom_class", model=PROPOSER, num_speculative_tokens=8)
    return DASProposer(SimpleNamespace(
        speculative_config=spec,
        additional_config={CONFIG_KEY: {"batch_cap": "phase", "prior": 0.0},
                           "vllm_rl_cost": "h100:qwen3-8b"},
        model_config=SimpleNamespace(max_model_len=512)))


def _rule(p, decision):
    """What das.caps.phase_budgets says for a logged decision (same table, same inputs)."""
    from vllm_rl.das.batch_caps import phase_budgets

    curve = [p.cost.uniform_ms(decision["batch"], 1 + k, decision["context"]) for k in range(9)]
    return phase_budgets(curve.__getitem__, decision["batch"], list(decision["q"]),
                         list(decision["caps"]))


ROLLOUT = list(range(11, 40))


def test_phase_cap_drafts_the_rules_length_in_the_tail():
    """One request left: the table makes its width nearly free, so it drafts what the
    rule gives at its acceptance estimate, cut from the tree's draft."""
    p, runner = _phase_proposer(), Runner()
    p.prebuild("P", [ROLLOUT + [EOS]], PROMPT)
    runner.add("r", _request({"problem_id": "P"}, max_tokens=200))
    drafts = runner.step(p, {"r": [11]})
    (decision,) = p.phase()
    assert decision["batch"] == 1 and decision["caps"] == (8,)      # the tree had 8
    assert decision["k"] == tuple(_rule(p, decision)) and decision["k"][0] >= 6
    assert drafts["r"] == ROLLOUT[1:1 + decision["k"][0]]
    # accepted in full: the request's own estimate rises and it drafts the full budget
    drafts = runner.step(p, {"r": drafts["r"] + [ROLLOUT[1 + len(drafts["r"])]]},
                         drafts={"r": drafts["r"]})
    decision = p.phase()[-1]
    assert decision["verified"] == p.phase()[0]["k"][0]
    assert decision["q"][0] > 0.5 and decision["k"] == (8,) and len(drafts["r"]) == 8


def test_phase_cap_is_off_in_a_wide_batch_and_probes():
    """600 running requests at the prior acceptance 0.5: no request drafts (the tree is not
    asked) until PROBE_EVERY such steps, then PROBE_ROWS requests draft once."""
    from vllm_rl.das.draft_lengths import PROBE_EVERY, PROBE_ROWS

    p, runner = _phase_proposer(), Runner()
    rows = [f"r{i}" for i in range(600)]
    for rid in rows:
        p.prebuild(rid, [ROLLOUT + [EOS]], PROMPT)              # a problem per request
        runner.add(rid, _request({"problem_id": rid}, max_tokens=200))
    for step in range(PROBE_EVERY):
        drafts = runner.step(p, {rid: [ROLLOUT[step]] for rid in rows})
        decision = p.phase()[-1]
        assert decision["batch"] == 600
        if step < PROBE_EVERY - 1:
            assert not any(drafts.values()) and not decision["probe"]
            assert not any(decision["k"]) and decision["k"] == tuple(_rule(p, decision))
    assert decision["probe"] and sum(map(bool, drafts.values())) == PROBE_ROWS
    assert p.stats()["phase"]["probes"] == 1


def test_phase_cap_reads_the_trees_draft_length():
    """The rule runs again on what the tree had: a tree that continues the context by three
    tokens caps the request at three."""
    p, runner = _phase_proposer(), Runner()
    p.prebuild("P", [[11, 12, 13, 14]], PROMPT)
    runner.add("r", _request({"problem_id": "P"}, max_tokens=200))
    drafts = runner.step(p, {"r": [11]})
    decision = p.phase()[-1]
    assert decision["caps"] == (3,) and drafts["r"] == [12, 13, 14]


def test_phase_cap_keeps_the_policy_budget_as_a_ceiling():
    """das.budget lowers the ceiling; budget 0 (or a short length class) drafts nothing."""
    p, runner = _phase_proposer(), Runner()
    p.prebuild("P", [ROLLOUT + [EOS]], PROMPT)
    runner.add("b1", _request({"problem_id": "P", "budget": 1}, max_tokens=200))
    runner.add("b0", _request({"problem_id": "P", "budget": 0}, max_tokens=200))
    drafts = runner.step(p, {"b1": [11], "b0": [11]})
    assert len(drafts["b1"]) == 2 and drafts["b0"] == []          # fixed policy: 2b


# ------------------------------------------- batch_cap="confidence" (the H100 table)


def _confidence_proposer(**cfg):
    spec = SimpleNamespace(method="custom_class", model=PROPOSER, num_speculative_tokens=8)
    return DASProposer(SimpleNamespace(
        speculative_config=spec,
        additional_config={CONFIG_KEY: {"batch_cap": "confidence", **cfg},
                           "vllm_rl_cost": "h100:qwen3-8b"},
        model_config=SimpleNamespace(max_model_len=512)))


def test_confidence_cap_prices_a_draft_token_on_the_table():
    """τ = B (t(w + 1) − t(w)) / t(0): nearly free on a small batch, more than half a
    token on a full one (the H100 table: a wide step is compute-bound)."""
    p = _confidence_proposer()
    p._context = 300.0
    prices = {b: p._draft_price(b) for b in (1, 16, 128, 512, 1024)}
    t0, t1 = p.cost.width_curve(512, [1.0, 2.0], 300.0)
    assert prices[512] == (t1 - t0) / t0
    assert prices[1] < 0.05 < prices[128] < prices[512] <= prices[1024] < 1.0
    p._width = 1.5                       # the last step verified 1.5 drafts a row: t(2) → t(3)
    t0, t2, t3 = p.cost.width_curve(128, [1.0, 2.0, 3.0], 300.0)
    assert p._draft_price(128) == (t3 - t2) / t0


def test_confidence_cap_cuts_each_draft_at_its_price():
    """Every row drafts its budget and stops where the tree's probability (count over its
    context's plus λ) falls below the step's price: long on one row, short on 600."""
    got = {}
    for n in (1, 600):
        p, runner = _confidence_proposer(prior=1.0), Runner()
        rows = [f"r{i}" for i in range(n)]
        rollouts = [ROLLOUT + [EOS]] * 3 + [ROLLOUT[:6] + [99, 98, 97, EOS]]
        for rid in rows:
            p.prebuild(rid, rollouts, PROMPT)
            runner.add(rid, _request({"problem_id": rid}, max_tokens=200))
        drafts = runner.step(p, {rid: [ROLLOUT[0]] for rid in rows})
        t0, t1 = p.cost.width_curve(n, [1.0, 2.0], p._context)    # the first step: w = 0
        tree = p.store.problems[rows[0]].tree
        want = tree.draft(PROMPT + [ROLLOUT[0]], 8, (t1 - t0) / t0, True)
        assert all(d == want for d in drafts.values()), n
        assert tree.prior == 1.0 and p.requests[rows[0]].min_prob == 0.0
        got[n] = len(want)
    assert got[1] == 8 and 0 < got[600] < 4


def test_confidence_cap_keeps_a_requests_own_cutoff():
    """A request's das.min_prob is a floor under the cap's price."""
    p, runner = _confidence_proposer(prior=1.0), Runner()
    p.prebuild("P", [ROLLOUT + [EOS]] * 3, PROMPT)
    runner.add("r", _request({"problem_id": "P", "min_prob": 0.4}, max_tokens=200))
    drafts = runner.step(p, {"r": [ROLLOUT[0]]})
    # the context occurs 4 times (its own rollout too), 3 continue: 3/5 = 0.6, then
    # 0.6 · 3/4 = 0.45 ≥ 0.4, then 0.34 < 0.4
    assert drafts["r"] == ROLLOUT[1:3]


# ------------------------------------------------ async scheduling (patches/model_runner/das_async.py)

class AsyncRunner:
    """What the proposer reads of vLLM's runner under async scheduling: the step's
    sampled ids stay a tensor, the token array holds placeholders, drafts go to
    ``_draft_token_ids`` by the previous step's rows (``before_step``)."""

    use_async_scheduling = True
    _draft_token_req_ids = None

    def __init__(self):
        import torch

        self.device = torch.device("cpu")
        self.requests, self.rows = {}, []
        self.published = None
        self._draft_token_ids = None
        self.prev_num_spec_tokens = 0

    def add(self, rid, cached):
        self.requests[rid] = cached
        self.rows.append(rid)

    def drop(self, rid):
        self.requests.pop(rid)
        self.rows.remove(rid)

    def _copy_valid_sampled_token_count(self, last, counts):
        self.published = (last.tolist(), counts.tolist())

    def step(self, proposer, sampled):
        """One step: its execute_model (``before_step`` on the scheduler's placeholders:
        8 per row), then its sampling (``sampled[rid]``, or ``sampled(verified)[rid]``:
        the model's tokens given the drafts each row verifies; -1 padded) and
        ``propose``.  Returns the drafts each row verified in this step."""
        import torch

        rows = list(self.rows)
        spec = {r: [-1] * 8 for r in rows}
        so = SimpleNamespace(scheduled_spec_decode_tokens=spec,
                             num_scheduled_tokens={r: 9 for r in rows},
                             total_num_scheduled_tokens=9 * len(rows))
        worker_so, cut, counts = proposer.before_step(self, so)
        drafts = self._draft_token_ids
        verified = {r: drafts[i, :counts.get(r, 0)].tolist() if drafts is not None and counts
                    else [] for i, r in enumerate(getattr(self, "_prev_rows", ()))}
        if callable(sampled):
            sampled = sampled(verified)
        self.input_batch = SimpleNamespace(req_ids=rows,
                                           num_prompt_tokens=np.array([len(PROMPT)] * len(rows)))
        self.discard_request_mask = SimpleNamespace(np=np.zeros(len(rows), dtype=bool))
        width = 1 + max(8, max((len(v) for v in sampled.values()), default=1))
        t = torch.full((len(rows), width), -1, dtype=torch.int64)
        for i, r in enumerate(rows):
            t[i, :len(sampled[r])] = torch.tensor(sampled[r])
        proposer.after_sample(self, t)
        proposer.bind_step(self, worker_so)
        proposer.propose([], None, None)
        self._prev_rows = rows
        return verified, counts


def test_async_drafts_without_lookahead_are_the_sync_drafts_one_step_later():
    """The same tokens through a synchronous and an asynchronous runner, the lookahead
    off: the async drafter waits for each step's tokens at the next step's start and
    drafts the same tokens.  (The linear cap: the cost cap counts the waiting drafter's
    measured host time.)"""
    rollouts = [[11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, EOS],
                [11, 12, 30, 31, 32, 33, 34, 35, EOS]]
    sync_p, sync_r = _proposer(batch_cap="linear"), Runner()
    async_p, async_r = _proposer(batch_cap="linear", lookahead=False), AsyncRunner()
    for p, r in ((sync_p, sync_r), (async_p, async_r)):
        p.prebuild("P", rollouts, PROMPT)
        r.add("a", _request({"problem_id": "P", "policy": "fixed"}))
        r.add("b", _request({"problem_id": "P", "policy": "fixed"}))
    steps = [{"a": [11], "b": [11]}, {"a": [12, 13], "b": [12]}, {"a": [14], "b": [30, 31]},
             {"a": [15, 16, 17], "b": [32]}]
    expect = []
    for sampled in steps:
        expect.append(sync_r.step(sync_p, sampled))
    got = []
    for sampled in steps + [{"a": [18], "b": [33]}]:
        verified, _ = async_r.step(async_p, sampled)
        got.append(verified)
    assert got[1:] == expect                      # step n's drafts, verified in step n + 1
    assert all(any(v) for v in expect)
    assert async_r.published == ([18, 33], [1, 1])   # each row's last token and count
    assert async_p.stats()["per_problem"]["P"]["drafted"] > 0


def _follow(truth: list[int], pos: dict, diverge: dict | None = None):
    """A model that generates ``truth`` (per row): it accepts the drafts that match it
    and its bonus token is the next true token (``diverge[step]``: another token)."""
    def sample(verified):
        out = {}
        for rid, d in verified.items():
            toks = []
            for t in d:
                if t != truth[pos[rid]]:
                    break
                toks.append(t)
                pos[rid] += 1
            toks.append(truth[pos[rid]])
            pos[rid] += 1
            out[rid] = toks
        return out
    return sample


def test_lookahead_drafts_from_the_guessed_outcome_without_waiting():
    """Under async scheduling the drafts of step n + 1 are made before step n's tokens
    are known: from the context up to step n - 1, step n's drafts and the tree's own
    next token as step n's bonus token.  A model that follows the stored rollout accepts
    every draft, as it does from synchronous drafts; none of the drafter's work waits
    for the step in flight (its tokens are taken in one step later)."""
    truth = list(range(11, 60)) + [EOS]
    p, runner = _proposer(batch_cap="linear"), AsyncRunner()
    p.prebuild("P", [truth], PROMPT)
    runner.add("a", _request({"problem_id": "P", "policy": "fixed"}, max_tokens=40))
    pos = {"a": 0}
    runner.step(p, {"a": [truth[0]]})
    pos["a"] = 1
    for _ in range(3):
        verified, _ = runner.step(p, _follow(truth, pos))
        # 8 drafts a step, every one the model's next token
        assert verified["a"] == truth[pos["a"] - 9:pos["a"] - 1]
        # the step just sampled and the one before are not taken in yet
        assert [f.fed for f in p._in_flight] == [False, False]


def test_lookahead_hypotheses_cover_a_partial_acceptance():
    """Two stored rollouts share (11, 12) and then part (13 … and 60 …).  A row drafts
    along the first; the model accepts 12, rejects 13 and samples 60.  Among the
    hypotheses of that step's outcome was "one draft accepted, then another next token
    than the rejected 13", with the second rollout's 60, so the device picks the drafts
    made on it: the next step verifies the second rollout's continuation, the drafts
    synchronous scheduling makes once it knows the outcome, and the model accepts all of
    them."""
    first = list(range(11, 40)) + [EOS]
    second = [11, 12] + list(range(60, 90)) + [EOS]
    p, runner = _proposer(batch_cap="linear"), AsyncRunner()
    p.prebuild("P", [first, second], PROMPT)
    runner.add("a", _request({"problem_id": "P", "policy": "fixed"}, max_tokens=40))
    runner.step(p, {"a": [11]})
    pos = {"a": 1}
    verified, _ = runner.step(p, _follow(second, pos))
    assert verified["a"] == first[1:9]                   # 12, 13, …: along the first
    assert pos["a"] == 3                                 # sampled 12, 60
    verified, _ = runner.step(p, _follow(second, pos))
    assert verified["a"] == second[3:11]                 # 61 … 68: all accepted
    assert pos["a"] == 12
    looked = p.stats()["lookahead"]          # both drafting steps chose a hypothesis
    assert looked["matched"] == looked["rows"] >= 2


def test_a_wrong_guess_costs_one_step_of_drafts():
    """Where the model's tokens are not the lookahead's guess, the next step's drafts
    were made on the wrong guess: the model rejects them (its tokens are its own).  Once
    the step is taken in, the drafts made on it are known to be unsound and are assumed
    rejected, so the drafts after them are made from the true context again."""
    truth = list(range(11, 60)) + [EOS]
    p, runner = _proposer(batch_cap="linear"), AsyncRunner()
    p.prebuild("P", [truth], PROMPT)
    runner.add("a", _request({"problem_id": "P", "policy": "fixed"}, max_tokens=40))
    runner.step(p, {"a": [truth[0]]})
    verified, _ = runner.step(p, lambda v: {"a": v["a"][:3] + [99]})   # diverges: 99
    assert verified["a"] == truth[1:9]
    # the model goes on with the stored rollout from 15 on (its context ... 14, 99)
    after = truth[4:]
    pos = {"a": 0}
    verified, _ = runner.step(p, _follow(after, pos))
    assert verified["a"] == truth[10:18]         # made on the guess: all rejected
    # known wrong: the next drafts come from the true context (... 14, 99), after which
    # the tree has nothing
    verified, _ = runner.step(p, _follow(after, pos))
    assert verified["a"] == []
    for _ in range(2):
        # from (... 99, 15) on the stored rollout again: the model's tokens
        verified, _ = runner.step(p, _follow(after, pos))
        assert verified["a"] and verified["a"] == after[pos["a"] - len(verified["a"]) - 1:
                                                        pos["a"] - 1]


def test_async_catch_up_feeds_every_step_and_seals_a_departed_request_once_fed():
    """A row that drafts nothing is fed on the feeder thread; a request that leaves the
    runner is sealed only after its last tokens were fed (never while the feeder still
    extends its rollout)."""
    p, runner = _proposer(), AsyncRunner()
    runner.add("quiet", _request({"problem_id": "P", "budget": 0}))
    runner.add("gone", _request({"problem_id": "P", "budget": 0}))
    for tok in range(5, 25):
        runner.step(p, {"quiet": [tok], "gone": [tok + 100]})
    runner.drop("gone")                          # left the runner (e.g. cancelled)
    for tok in range(25, 30):
        runner.step(p, {"quiet": [tok]})
    p.sync()
    seqs = sorted(p.store.sequences("P"), key=len)
    assert seqs[0] == PROMPT + [t + 100 for t in range(5, 25)]    # all its tokens, sealed
    assert seqs[1] == PROMPT + list(range(5, 30))
    assert "gone" not in p.requests


def test_async_rows_keep_their_slots_while_no_slot_changes_hands():
    """Under async scheduling a step's rows are mapped to slots when its drafts are
    planned and reused when its tokens are taken in; a request id reused in between (a
    new rollout takes the old one's slot) maps them again: each rollout keeps its own
    tokens, in its own problem's tree."""
    p, runner = _proposer(), AsyncRunner()
    runner.add("keep", _request({"problem_id": "K", "budget": 0}))
    runner.add("r", _request({"problem_id": "P", "budget": 0}))
    for tok in range(5, 9):
        runner.step(p, {"keep": [tok], "r": [tok + 100]})
    runner.drop("r")
    runner.add("r", _request({"problem_id": "Q", "budget": 0}))   # same id, a new request
    for tok in range(9, 12):
        runner.step(p, {"keep": [tok], "r": [tok + 200]})
    p.sync()
    assert list(p.store.sequences("K")) == [PROMPT + list(range(5, 12))]
    assert list(p.store.sequences("P")) == [PROMPT + [t + 100 for t in range(5, 9)]]
    assert list(p.store.sequences("Q")) == [PROMPT + [t + 200 for t in range(9, 12)]]


class _LazyFeeder:
    """The feeder thread at its slowest: its calls run in order (one worker), each only
    when it or a later one is waited for."""

    def __init__(self):
        self.calls, self.results = [], []

    def submit(self, fn, *args):
        self.calls.append((fn, args))
        k = len(self.calls)

        def result():
            while len(self.results) < k:
                call, call_args = self.calls[len(self.results)]
                self.results.append(call(*call_args))
            return self.results[k - 1]
        return SimpleNamespace(result=result)


def test_a_natural_end_is_fed_after_the_feeds_before_it():
    """Under async scheduling a row that drafts nothing is fed on the feeder thread, and
    a natural end is fed and sealed as its step is taken in: the feeder's last call is
    finished first, whenever the feeder runs, so the rollout keeps its tokens in order."""
    p, runner = _proposer(), AsyncRunner()
    p._feeder = _LazyFeeder()
    runner.add("a", _request({"problem_id": "P", "budget": 0}))
    runner.add("b", _request({"problem_id": "P", "budget": 0}))
    for tok in range(5, 12):
        runner.step(p, {"a": [tok], "b": [tok + 100]})
    runner.step(p, {"a": [EOS], "b": [112]})
    for tok in range(113, 116):
        runner.step(p, {"a": [], "b": [tok]})
    p.sync()
    assert sorted(p.store.sequences("P")) == [PROMPT + list(range(5, 12)) + [EOS],
                                              PROMPT + list(range(105, 116))]


def test_a_departed_request_is_sealed_after_every_step_taken_in_with_it_is_fed():
    """A step that takes in two steps at once (drafting turns on without the lookahead:
    it waits for both) feeds both on the feeder thread; a request that left the runner
    in between, in the older step only, is sealed after that feed, not before it."""
    truth = list(range(11, 60)) + [EOS]
    p, runner = _proposer(batch_cap="linear", lookahead=False), AsyncRunner()
    p._feeder = _LazyFeeder()
    p.prebuild("P", [truth], PROMPT)
    runner.add("a", _request({"problem_id": "P", "policy": "fixed"}, max_tokens=40))
    runner.add("q", _request({"problem_id": "Q", "budget": 0}))
    pos = {"a": 1}
    model = _follow(truth, pos)

    def a_follows(verified):
        return model({"a": verified.get("a", [])})
    runner.step(p, {"a": [truth[0]], "q": [100]})
    for tok in range(101, 104):
        runner.step(p, lambda v, tok=tok: {**a_follows(v), "q": [tok]})
    p._drafting = False              # the last decision drafted nothing: one step stays out
    runner.drop("q")
    runner.step(p, a_follows)
    assert len(p._in_flight) == 2    # the step with q's last token, and the one after it
    runner.step(p, a_follows)        # drafting again: both taken in, q gone
    p.sync()
    assert p.store.sequences("Q") == [PROMPT + [100, 101, 102, 103]]


def test_force_drafts_past_a_batch_cap_that_is_off():
    """``das.force``: the request drafts its budget where the batch cap has drafting off
    for everyone else (forced on); ``budget: 0`` drafts nothing (forced off)."""
    p = _proposer(batch_cap="linear", full_batch=0, off_batch=0)
    rollout = [11, 12, 13, 14, 15, 16, 17, 18, 19, 20]
    p.prebuild("P", [rollout + [EOS]], PROMPT)
    runner = Runner()
    runner.add("capped", _request({"problem_id": "P", "policy": "fixed"}))
    runner.add("forced", _request({"problem_id": "P", "policy": "fixed", "force": True}))
    runner.add("off", _request({"problem_id": "P", "policy": "fixed", "force": True,
                                "budget": 0}))
    drafts = runner.step(p, {"capped": [11], "forced": [11], "off": [11]})
    assert drafts["capped"] == [] and drafts["off"] == []
    assert drafts["forced"] == [12, 13, 14, 15, 16, 17, 18, 19]


def test_a_steps_admissions_share_a_groups_flags_and_initial_class(monkeypatch):
    p, runner = _proposer(), Runner()
    runner.add("old", _request({"problem_id": "P"}))
    runner.step(p, {})
    calls = []
    initial = p.classes.initial
    monkeypatch.setattr(p.classes, "initial",
                        lambda lengths, max_tokens: calls.append(1) or initial(lengths, max_tokens))
    group = _request({"problem_id": "P"})
    for i in range(3):                       # vLLM's children: shallow copies of one params
        runner.add(f"g{i}", SimpleNamespace(sampling_params=copy.copy(group.sampling_params),
                                            prompt_token_ids=list(PROMPT)))
    runner.step(p, {"old": [5]})
    states = [p.requests[f"g{i}"] for i in range(3)]
    assert len(calls) == 1                   # Init_r once for the group's problem
    assert len({id(st.flags) for st in states}) == 1 and states[0].flags.problem_id == "P"
    runner.drop("old")
    runner.add("g3", SimpleNamespace(sampling_params=copy.copy(group.sampling_params),
                                     prompt_token_ids=list(PROMPT)))
    runner.add("old", _request({"problem_id": "P"}))   # a reused id, admitted after g3
    calls.clear()
    runner.step(p, {})
    assert len(calls) == 2                   # its seal may slide P's window: read again


class _Clock:
    """A stand-in for the ``time`` module the drafter reads: every call moves the clock
    on by ``tick_ns``, whatever the host did (``tick_ns`` large: a loaded host)."""

    def __init__(self, tick_ns: int):
        self.tick_ns, self.now, self.calls = tick_ns, 10**12, 0

    def perf_counter_ns(self) -> int:
        self.calls += 1
        self.now += self.tick_ns
        return self.now

    def perf_counter(self) -> float:
        return self.perf_counter_ns() / 1e9


def test_on_a_named_table_a_loaded_host_changes_no_draft(monkeypatch):
    """The default drafter (confidence cap, lookahead) priced on a step-cost table reads
    no clock in its decisions: the same steps with every interval the drafter times at
    1 µs and at 40 ms (a quiet and a loaded host) give the same drafts, row by row and
    step by step.  (With ``cost="online"`` the model is fitted on wall times, and a
    loaded host moves it.)"""
    from vllm_rl.das import async_drafts, draft_lengths, drafter

    truth = list(range(11, 60)) + [EOS]
    other = [11, 12] + list(range(60, 100)) + [EOS]
    rows = [f"r{i}" for i in range(48)]

    def run(tick_ns: int):
        clock = _Clock(tick_ns)
        for module in (async_drafts, draft_lengths, drafter):
            monkeypatch.setattr(module, "time", clock)
        p, runner = _confidence_proposer(), AsyncRunner()
        for i, rid in enumerate(rows):
            p.prebuild(f"P{i % 6}", [truth, other, truth[:20] + [EOS]], PROMPT)
            runner.add(rid, _request({"problem_id": f"P{i % 6}"}, max_tokens=40))
        pos = {rid: 1 for rid in rows}
        first = {rid: [truth[0]] for rid in rows}
        steps = [runner.step(p, first)[0]]
        for k in range(8):
            # rows follow the first rollout or, one in three, the second
            steps.append(runner.step(p, lambda v: {
                **_follow(truth, pos)({r: d for r, d in v.items() if int(r[1:]) % 3}),
                **_follow(other, pos)({r: d for r, d in v.items() if not int(r[1:]) % 3})})[0])
        return steps, clock.calls

    quiet, quiet_calls = run(1_000)
    loaded, loaded_calls = run(40_000_000)
    assert quiet_calls > 0 and loaded_calls > 0
    assert quiet == loaded
    assert sum(len(d) for s in quiet for d in s.values()) > 0
