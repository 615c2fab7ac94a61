"""One rollout step of one configuration through the engine, and the steps before it
(``vllm-rl bench step``, :mod:`vllm_rl.bench.step.command`): :func:`run_once` drives the
step through the engine's step loop and prices its engine steps (:class:`Run`);
:func:`previous_steps` runs the untimed steps that fill DAS's trees, DARTS's length
statistics, DUET's thresholds and ARRoL's head; :func:`step_params` is what each
configuration sends; :func:`reset_trees` puts the trees back between configurations."""
from __future__ import annotations

import copy
import statistics
import time
from dataclasses import dataclass, field

from vllm_rl.bench.matrix import is_config, partial_setting, technique_flags


@dataclass
class Run:
    """One configuration's rollout step."""

    config: str
    repeat: int
    wall_s: float
    tokens: int
    engine_steps: int
    projected_ms: float
    samples: int
    kept: int
    kept_mean_reward: float
    kept_mean_length: float
    reasons: dict[str, int] = field(default_factory=dict)
    draft_proposed: int = 0
    draft_accepted: int = 0
    diagnostics: dict[str, float] = field(default_factory=dict)
    lengths: list[int] = field(default_factory=list)
    batch_profile: list[int] = field(default_factory=list)
    step_wall_ms: list[float] = field(default_factory=list)
    host_counted_ms: float = 0.0     # projected_ms with the host time counted
    host_core_ms: float = 0.0        # measured: schedule + update_from_output (x host_scale)
    host_worker_ms: float = 0.0      # measured: drafter + scorer (x host_scale)
    asynchronous: bool | None = None     # how the engine schedules
    timeline: dict = field(default_factory=dict)   # per step: gpu_ms, core_ms, worker_ms
    groups: int = 0                  # complete groups the step delivered to the trainer


def drive(llm, name: str, params: list, prompts: list, repeat: int) -> tuple[list, float]:
    """One rollout step through the engine's step loop (one request per prompt, its own
    ``SamplingParams``): the outputs in order, and the wall time."""
    from vllm.sampling_params import RequestOutputKind

    from vllm_rl.llm import attach_rollout_info

    engine = llm.llm_engine
    ids, outputs = {}, {}
    t0 = time.perf_counter()
    for i, (prompt, sp) in enumerate(zip(prompts, params)):
        sp.output_kind = RequestOutputKind.FINAL_ONLY
        rid = f"{name}-{repeat}-{i}"
        ids[rid] = i
        engine.add_request(rid, prompt, sp)
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                outputs[ids[out.request_id]] = out
    wall = time.perf_counter() - t0
    outs = [outputs[i] for i in range(len(prompts))]
    attach_rollout_info(outs, params)
    return outs, wall


def run_once(llm, name: str, params: list, prompts: list[str], repeat: int, cost,
             host_scale: float = 1.0) -> Run:
    """One rollout step of configuration ``name`` and its records.  With partial
    rollouts (``+partial``) the timed step is APRIL's third: two untimed steps first fill
    the carry buffer, then the step launches the carried samples' continuations beside
    the prompts and ends by its rule; its groups are those complete (their samples from
    any of the three steps: the lengths, rewards and marks are the whole samples')."""
    from vllm_rl.engine.trace import engine_trace

    trace = engine_trace(llm)
    setting = partial_setting(name) if is_config(name) else None
    if setting is None:
        mark = trace.mark()
        outs, wall = drive(llm, name, params, prompts, repeat)
        groups = [(prompt, (sp.extra_args or {}).get("vllm_rl"),
                   [(c.rollout_info, c.text, len(c.token_ids)) for c in out.outputs])
                  for prompt, out, sp in zip(prompts, outs, params)]
        return _summarize_step(name, repeat, trace.since(mark), groups, wall, cost, host_scale)
    from vllm_rl.integrations.common.partial import CarryBuffer, PartialConfig

    cfg, buffer = PartialConfig(**setting), CarryBuffer()
    max_tokens = params[0].max_tokens
    for step in range(3):
        step_params_ = [copy.deepcopy(sp) for sp in params]
        for sp in step_params_:
            sp.seed = sp.seed + 1_000_003 * (2 - step)      # the timed step: the seeds given
        launched = buffer.launch(cfg, 1_000 * repeat + step, prompts, step_params_,
                                 max_tokens, 1.0)
        mark = trace.mark()
        outs, wall = drive(llm, f"{name}-s{step}", launched.params, launched.prompts, repeat)
        complete = buffer.finish(launched, outs)
    groups = [(g.prompt, g.flags, [(p.info, p.text, len(p.token_ids)) for p in g.ended])
              for g in complete]
    return _summarize_step(name, repeat, trace.since(mark), groups, wall, cost, host_scale)


def _summarize_step(name: str, repeat: int, steps, groups: list, wall: float, cost,
                    host_scale: float) -> Run:
    """A :class:`Run` from the engine steps it took and its groups (prompt, the flags
    sent, per sample: record, text, length)."""
    from vllm_rl.integrations.common.advantages import group_advantages, step_diagnostics
    from vllm_rl.integrations.common.marks import training_marks
    from vllm_rl.task import reward

    marks, rewards, members, kept, lengths, reasons = [], [], [], [], [], {}
    proposed = accepted = 0
    for i, (prompt, flags, samples) in enumerate(groups):
        infos = [info for info, _, _ in samples]
        for (info, text, n), mk in zip(samples, training_marks(infos, [flags] * len(infos))):
            r = reward(prompt, text)
            marks.append(mk)
            rewards.append(r)
            members.append(i)
            lengths.append(n)
            reasons[info.reason.value] = reasons.get(info.reason.value, 0) + 1
            proposed += info.draft_proposed or 0
            accepted += info.draft_accepted or 0
            if mk.keep:
                kept.append((r, n))
    diag = step_diagnostics(marks, group_advantages(rewards, marks, members), members)
    proj = steps.project(cost, host_scale=host_scale)
    core, worker, path = steps.host_ms()
    timeline = {"gpu_ms": list(proj.per_step_ms),
                "core_ms": [host_scale * c for c in core],
                "worker_ms": [host_scale * w for w in worker],
                "path_ms": [host_scale * p for p in path],
                "gc_ms": [host_scale * g for g in steps.gc_ms()]}     # of core_ms
    return Run(name, repeat, wall, sum(lengths), len(steps), proj.total_ms,
               len(lengths), len(kept),
               statistics.fmean(r for r, _ in kept) if kept else 0.0,
               statistics.fmean(n for _, n in kept) if kept else 0.0, reasons, proposed,
               accepted, diag, lengths, [len(w) for w, _ in steps.steps()],
               list(steps.wall_ms), proj.host_counted_ms, proj.host_core_ms,
               proj.host_worker_ms, proj.asynchronous, timeline, len(groups))


# ----------------------------------------------------------------------------- the step


def previous_steps(rl, prompts: list[str], args, planner, feedback,
                   plain=None) -> tuple[dict, dict]:
    """``args.history`` untimed steps on the DAS engine (``--history``, default 2; module
    docstring): DAS trees, DARTS's length statistics, DUET's K1/K2 and ARRoL's head (given
    to ``plain`` too, the RL engine without DAS).  Returns DUET's thresholds and, per
    prompt, its prompt ids and the rollouts the steps drew (what its tree holds:
    :func:`reset_trees`)."""
    from vllm import SamplingParams

    from vllm_rl import Reason, rl_params
    from vllm_rl.duet.rule import km_quantile
    from vllm_rl.task import reward

    observations, trees = [], {}
    for step in range(args.history):
        params = [SamplingParams(n=args.m, temperature=1.0, max_tokens=args.max_tokens,
                                 seed=args.seed + 100_000 + 1000 * step + i,
                                 extra_args=rl_params(das={"problem_id": p}, arrol={
                                     "l_detect": args.l_detect, "return_hidden": True}))
                  for i, p in enumerate(prompts)]
        outs = rl.generate(prompts, params, use_tqdm=False)
        infos, rewards, groups = [], [], []
        planner.observe({prompt: [len(c.token_ids) for c in out.outputs]
                         for prompt, out in zip(prompts, outs)})
        for prompt, out in zip(prompts, outs):
            _, drawn = trees.setdefault(prompt, (list(out.prompt_token_ids), []))
            drawn.extend(list(c.token_ids) for c in out.outputs)
            for c in out.outputs:
                infos.append(c.rollout_info)
                rewards.append(reward(prompt, c.text))
                groups.append(prompt)
                observations.append((len(c.token_ids), c.rollout_info.reason is Reason.EOS,
                                     1.0))
        update = feedback.observe(infos, rewards, groups)
        if update is not None:
            for engine in (rl, plain):
                if engine is not None:
                    engine.arrol_update(**update)
    k1 = km_quantile(observations, 0.30)
    return {"k1": k1, "k2": max(k1, km_quantile(observations, 0.80))}, trees


def reset_trees(rl, trees: dict) -> None:
    """The DAS engine's trees as the previous steps left them (``trees``, from
    :func:`previous_steps`), before each configuration that drafts: the configurations
    run one after another on one engine with the same prompts, problem ids and seeds,
    and without this one would draft from an earlier one's rollouts of the same step."""
    rl.das_clear()
    for prompt, (prompt_ids, rollouts) in trees.items():
        rl.das_prebuild(prompt, rollouts, prompt_ids)


def step_params(name: str, prompts: list[str], args, plans: dict, duet: dict) -> list:
    """Each prompt's ``SamplingParams`` under configuration ``name`` (same seeds for all)."""
    from vllm import SamplingParams

    from vllm_rl import rl_params
    from vllm_rl.darts import DartsPlanner

    def sp(i: int, n: int, extra):
        return SamplingParams(n=n, temperature=1.0, max_tokens=args.max_tokens,
                              seed=args.seed + 7919 * i, extra_args=extra)

    m, out = args.m, []
    for i, prompt in enumerate(prompts):
        if name.startswith("stock"):
            out.append(sp(i, int(name.split("-")[1]), None))
            continue
        if name == "darts-shortest":
            out.append(sp(i, 2 * m, rl_params(group={"size": m}, darts={"mode": "shortest"})))
            continue
        if name == "das-off":
            out.append(sp(i, m, rl_params(das={"problem_id": prompt, "budget": 0})))
            continue
        flags = technique_flags(name, args.max_tokens, args.l_detect, duet)
        n = m
        if "das" in flags:
            flags["das"] = {**flags["das"], "problem_id": prompt}
        if "darts" in flags:            # the planner's: none where DARTS is off
            plan = plans[prompt]
            n = plan.n
            del flags["darts"]
            flags.pop("group", None)
            flags.update(DartsPlanner.flags(plan))
        out.append(sp(i, n, rl_params(**flags)))
    return out


__all__ = ["Run", "drive", "previous_steps", "reset_trees", "run_once", "step_params"]
