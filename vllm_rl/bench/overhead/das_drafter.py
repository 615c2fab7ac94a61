"""The DAS drafter's host time per request-step, without an engine.

    python -m vllm_rl.bench.overhead.das_drafter                       # 128, 512, 1,024 rows
    python -m vllm_rl.bench.overhead.das_drafter --rows 1024 --steps 64 --batch-cap linear

:func:`measure` drives :meth:`vllm_rl.das.drafter.DASProposer.propose` the way vLLM's
model runner does (``sampled_token_ids`` as lists, ``num_tokens_no_spec`` and the
runner's ``token_ids_cpu`` as int32 arrays, the step's ``SchedulerOutput`` bound first)
on a synthetic rollout step: ``rows`` live DAS requests, ``group`` per problem (GRPO's
samples of one prompt), each problem's tree prebuilt with ``prebuilt`` finished rollouts;
every request follows its own noisy copy of its problem's text, so drafts match part of
the time, and each step's sampled tokens are the accepted prefix of the previous draft
plus one (what the rejection sampler would return).  Only ``propose`` is timed, after
``warmup`` steps (the admission of every request happens in the first one): its CPU
time (the thread's, robust on a loaded machine) and its wall time (``HOST.drafter_ns``,
the figure the engine's step trace reports).

The result splits the CPU time per request-step into the C++ feed (tree updates), the
C++ draft (the batched call's own per-phase CPU times), and the Python around them
(``python`` = total - feed - draft).  With ``background_feed`` (the default) the rows
that draft nothing are fed on the drafter's feeder thread, off the step's path: their
CPU time is apart (``feed_background``), and what the next step waits for it is in
``total``.  The DAS budget of the overhead benchmark (:mod:`vllm_rl.bench.overhead.command`) is
3 µs per request-step.
"""
from __future__ import annotations

import argparse
import json
import random
import time
from types import SimpleNamespace

import numpy as np

VOCAB = 32000
EOS = 2


def _proposer(cfg: dict, max_model_len: int, k_max: int, cost):
    from vllm_rl.das.config import CONFIG_KEY, PROPOSER
    from vllm_rl.das.drafter import DASProposer

    spec = SimpleNamespace(method="custom_class", model=PROPOSER, num_speculative_tokens=k_max)
    extra = {CONFIG_KEY: cfg}
    if cost is not None:
        extra["vllm_rl_cost"] = cost
    return DASProposer(SimpleNamespace(speculative_config=spec, additional_config=extra,
                                       model_config=SimpleNamespace(max_model_len=max_model_len)))


def noisy(rng: random.Random, text: list[int], p: float) -> list[int]:
    """``text`` with each token replaced by a random one with probability ``p``."""
    return [rng.randrange(3, VOCAB) if rng.random() < p else t for t in text]


class _Runner:
    """What the proposer reads of vLLM's GPU model runner: ``input_batch.req_ids`` /
    ``num_prompt_tokens`` / ``num_tokens_no_spec`` / ``token_ids_cpu`` and
    ``requests[rid].sampling_params`` / ``prompt_token_ids``."""

    def __init__(self, rows: int, max_model_len: int):
        self.requests: dict = {}
        self.input_batch = SimpleNamespace(
            req_ids=[], num_prompt_tokens=np.zeros(rows, dtype=np.int32),
            num_tokens_no_spec=np.zeros(rows, dtype=np.int32),
            token_ids_cpu=np.zeros((rows, max_model_len), dtype=np.int32))


def measure(rows: int, steps: int, *, group: int = 8, policy: str = "fixed",
            batch_cap: str = "cost", cost: str | None = None, budget: int = 4,
            prebuilt: int = 8, length: int = 2048, prompt: int = 64, noise: float = 0.1,
            warmup: int = 4, seed: int = 0) -> dict:
    """The drafter's host µs per request-step at ``rows`` live requests over ``steps``
    measured steps (see the module docstring).  ``policy`` / ``batch_cap`` / ``cost``
    are the engine's DAS settings (``batch_cap="all"``: the linear cap with its full
    budget at any batch, so every row drafts ``2 * budget`` tokens: the worst case).

    Returns ``{"rows", "steps", "us_per_request_step": {"total", "feed", "draft",
    "python", "wall"}, "drafting_rows_per_step", "mean_draft_len",
    "accepted_per_draft"}``: CPU µs except ``wall`` (``feed``/``draft`` are None for a
    drafter without ``host_ns``)."""
    from vllm_rl import rl_params
    from vllm_rl.cost.host import WORKER as HOST

    rng = random.Random(seed)
    cfg = {"policy": policy, "budget": budget}
    if batch_cap == "all":
        cfg.update(batch_cap="linear", full_batch=rows, off_batch=rows + 1)
    else:
        cfg["batch_cap"] = batch_cap
    max_model_len = prompt + length + 64
    k_max = 2 * budget
    p = _proposer(cfg, max_model_len, k_max, cost)
    runner = _Runner(rows, max_model_len)
    batch = runner.input_batch
    n_problems = max(1, rows // group)
    targets, prompts = [], []
    for j in range(n_problems):
        text = [rng.randrange(3, VOCAB) for _ in range(length)]
        pr = [rng.randrange(3, VOCAB) for _ in range(prompt)]
        p.prebuild(f"P{j}", [noisy(rng, text, noise) + [EOS] for _ in range(prebuilt)], pr)
        prompts.append(pr)
        targets.append(text)
    follow = []
    for i in range(rows):
        j = i % n_problems
        rid = f"r{i}"
        params = SimpleNamespace(extra_args=rl_params(das={"problem_id": f"P{j}"}),
                                 max_tokens=length, all_stop_token_ids=set(),
                                 eos_token_id=EOS, ignore_eos=False)
        runner.requests[rid] = SimpleNamespace(sampling_params=params,
                                               prompt_token_ids=prompts[j])
        batch.req_ids.append(rid)
        batch.num_prompt_tokens[i] = prompt
        batch.token_ids_cpu[i, :prompt] = prompts[j]
        batch.num_tokens_no_spec[i] = prompt
        follow.append(noisy(rng, targets[j], noise))
    pos = [0] * rows
    drafts: list[list[int]] = [[] for _ in range(rows)]
    total_ns = cpu_ns = 0
    feed0 = draft0 = None
    drafting = drafted = accepted = 0
    for step in range(warmup + steps):
        sampled, spec = [], {}
        for i in range(rows):
            d, t, at = drafts[i], follow[i], pos[i]
            acc = 0
            while acc < len(d) and at + acc < len(t) and d[acc] == t[at + acc]:
                acc += 1
            got = t[at:at + acc + 1]
            if d:
                spec[batch.req_ids[i]] = d
                if step >= warmup:
                    drafting += 1
                    drafted += len(d)
                    accepted += acc
            n = int(batch.num_tokens_no_spec[i])
            batch.token_ids_cpu[i, n:n + len(got)] = got
            batch.num_tokens_no_spec[i] = n + len(got)
            pos[i] += len(got)
            sampled.append(got)
        if step == warmup:
            HOST.reset()
            timing = getattr(p, "host_ns", None)
            feed0, draft0 = (timing["feed"], timing["draft"]) if timing else (None, None)
            bg0 = timing.get("feed_background", 0) if timing else 0
        p.bind_step(runner, SimpleNamespace(scheduled_spec_decode_tokens=spec,
                                            num_scheduled_tokens={
                                                r: 1 + len(spec.get(r, ())) for r in
                                                batch.req_ids}))
        t0 = time.thread_time_ns()
        drafts = p.propose(sampled, batch.num_tokens_no_spec, batch.token_ids_cpu)
        if step >= warmup:
            cpu_ns += time.thread_time_ns() - t0
            total_ns = HOST.drafter_ns
    per = 1e-3 / (rows * steps)
    if hasattr(p, "settle"):
        p.settle()
    timing = getattr(p, "host_ns", None)
    feed = draft = background = None
    if timing is not None and feed0 is not None:
        feed = (timing["feed"] - feed0) * per
        draft = (timing["draft"] - draft0) * per
        background = (timing.get("feed_background", 0) - bg0) * per
    total = cpu_ns * per
    return {
        "rows": rows, "steps": steps, "policy": policy, "batch_cap": batch_cap,
        "us_per_request_step": {
            "total": total, "feed": feed, "draft": draft,
            "python": None if feed is None else total - feed - draft,
            "wall": total_ns * per, "feed_background": background},
        "drafting_rows_per_step": drafting / steps,
        "mean_draft_len": drafted / drafting if drafting else 0.0,
        "accepted_per_draft": accepted / drafting if drafting else 0.0,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[128, 512, 1024])
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--batch-cap", nargs="+", default=["cost", "all"],
                    help="confidence, cost, phase, linear, or all (every row drafts 2b)")
    ap.add_argument("--policy", default="fixed")
    ap.add_argument("--cost", default="h100:qwen3-8b",
                    help="step-cost model (a table keeps the caps' decisions reproducible; "
                    "\"online\": the engine default, fitted to this process's step times)")
    ap.add_argument("--repeats", type=int, default=3, help="best of this many runs")
    ap.add_argument("--group", type=int, default=8, help="requests per problem")
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args(argv)
    out = []
    print("| rows | policy | batch cap | total µs | feed µs | draft µs | python µs "
          "| wall µs | background feed µs | drafting rows/step | draft len |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for cap in args.batch_cap:
        for rows in args.rows:
            runs = [measure(rows, args.steps, policy=args.policy, batch_cap=cap,
                            cost=args.cost, group=args.group, seed=r)
                    for r in range(args.repeats)]
            best = min(runs, key=lambda r: r["us_per_request_step"]["total"])
            out.append(best)
            u = best["us_per_request_step"]
            f = lambda v: "-" if v is None else f"{v:.2f}"      # noqa: E731
            print(f"| {rows} | {args.policy} | {cap} | {f(u['total'])} | {f(u['feed'])} | "
                  f"{f(u['draft'])} | {f(u['python'])} | {f(u['wall'])} | "
                  f"{f(u.get('feed_background'))} | {best['drafting_rows_per_step']:.1f} "
                  f"| {best['mean_draft_len']:.2f} |", flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
