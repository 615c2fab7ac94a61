"""``vllm-rl bench host-parts``: where each engine's host time goes, part by part, per step.

    vllm-rl bench host-parts                                  # 256 prompts x 8, max_tokens 128
    vllm-rl bench host-parts --prompts 128 --max-tokens 512   # the 128 x 8 point's workload

Stock vLLM, the DAS engine and the DAS engine with partial rollouts (the default
combination; ``--engines`` picks) run the same rollout step (:mod:`vllm_rl.bench.step`'s
prompts, seeds and ``das`` flags; in-process, asynchronous scheduling, an H100's scheduler
limits), one untimed warm-up step each first; with partial rollouts two, which fill the
carry buffer, so the timed step admits the carried samples' continuations beside the
prompts and ends by its rule (the step book, the carry and its records are timed too).  During the timed step every call of the parts in
:data:`TIMED` (vLLM's scheduler, the RL scheduler's additions, the DAS drafter's hooks
and their pieces) is timed with ``perf_counter_ns`` (about 0.3 µs a call) and charged to
the engine step in which it ran (the host work between one ``schedule`` and the next).
Steps are then grouped into phases by their batch (the requests scheduled) and whether
they verified drafts, and each part's mean ms per step is given beside the forward
pass's price on the step-cost table (``--cost``): where the host parts add up past it,
the step is host-bound (:func:`vllm_rl.cost.host.host_counted`).

A partial step trains only the groups it completes: each engine's complete groups per
projected second (GPU-only and host counted) are set beside stock's
(:func:`delivered_table`).  A part's time includes the parts indented below it
(:data:`ROWS`).  Output in ``--out``:
``host-parts.json`` (every step's parts), ``host-parts.png`` (per phase, stacked host
time of each engine against the forward pass) and the table on stdout; vLLM's log in
``vllm.log``.
"""
from __future__ import annotations

import argparse
import importlib
import json
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

# the parts timed: (label, module, class, method)
TIMED = (
    ("schedule", "vllm.v1.core.sched.scheduler", "Scheduler", "schedule"),
    ("RL update_from_output", "vllm_rl.engine.scheduler", "RLSchedulerMixin",
     "update_from_output"),
    ("vLLM's update_from_output", "vllm.v1.core.sched.scheduler", "Scheduler",
     "update_from_output"),
    ("RL _free_request (records)", "vllm_rl.engine.scheduler", "RLSchedulerMixin",
     "_free_request"),
    ("vLLM's _free_request", "vllm.v1.core.sched.scheduler", "Scheduler", "_free_request"),
    ("DAS before_step", "vllm_rl.das.async_drafts", "AsyncDrafts", "before_step"),
    ("_catch_up (ingest)", "vllm_rl.das.async_drafts", "AsyncDrafts", "_catch_up"),
    ("_feed (counts, natural ends)", "vllm_rl.das.requests", "RequestBook", "_feed"),
    ("_plan", "vllm_rl.das.async_drafts", "AsyncDrafts", "_plan"),
    ("_admit (admissions)", "vllm_rl.das.requests", "RequestBook", "_admit"),
    ("_decide (budgets, cap)", "vllm_rl.das.draft_lengths", "DraftBudgets", "_decide"),
    ("_tree_call", "vllm_rl.das.async_drafts", "AsyncDrafts", "_tree_call"),
    ("_take_guess", "vllm_rl.das.async_drafts", "AsyncDrafts", "_take_guess"),
    ("_retire (departures)", "vllm_rl.das.requests", "RequestBook", "_retire"),
    ("DAS after_sample", "vllm_rl.das.async_drafts", "AsyncDrafts", "after_sample"),
    ("DAS _begin_async", "vllm_rl.das.async_drafts", "AsyncDrafts", "_begin_async"),
    # partial rollouts: the continuations' admission, the step book, the carry
    ("RL add_request (admissions)", "vllm_rl.engine.scheduler", "RLSchedulerMixin",
     "add_request"),
    ("_end_steps (carry)", "vllm_rl.engine.scheduler", "RLSchedulerMixin", "_end_steps"),
    ("StepBook.due (step rules)", "vllm_rl.engine.steps", "StepBook", "due"),
    ("_finish_now (ends now)", "vllm_rl.engine.finish", "FinishMixin", "_finish_now"),
)
UPDATE = "update_from_output"   # the engine's whole update: the RL one where there is one
# the rows shown: (label, depth); a depth-1 row's time is inside the depth-0 row above it
ROWS = (("RL add_request (admissions)", 0), ("schedule", 0), (UPDATE, 0),
        ("vLLM's update_from_output", 1),
        ("RL _free_request (records)", 1), ("vLLM's _free_request", 1),
        ("StepBook.due (step rules)", 1), ("_end_steps (carry)", 1),
        ("_finish_now (ends now)", 2),
        ("DAS before_step", 0), ("_catch_up (ingest)", 1), ("_feed (counts, natural ends)", 1),
        ("_plan", 1), ("_admit (admissions)", 1), ("_decide (budgets, cap)", 1),
        ("_tree_call", 1), ("_take_guess", 1), ("_retire (departures)", 1),
        ("DAS after_sample", 0), ("DAS _begin_async", 0))
TOP = tuple(label for label, depth in ROWS if depth == 0)


@dataclass
class Timers:
    """The timed calls of one engine run: per engine step (one ``schedule`` call that
    scheduled tokens, as the step trace counts them), its batch, whether it verified
    drafts, and each part's nanoseconds."""

    widths: list[int] = field(default_factory=list)
    drafting: list[bool] = field(default_factory=list)
    ns: dict = field(default_factory=lambda: defaultdict(lambda: defaultdict(int)))

    def charge(self, label: str, ns: int) -> None:
        self.ns[label][max(len(self.widths) - 1, 0)] += ns

    def step(self, out) -> None:
        if out.num_scheduled_tokens:
            self.widths.append(len(out.num_scheduled_tokens))
            self.drafting.append(bool(getattr(out, "scheduled_spec_decode_tokens", None)))

    def per_step(self, label: str) -> np.ndarray:
        a = np.zeros(len(self.widths))
        for i, ns in self.ns.get(label, {}).items():
            if i < len(a):
                a[i] = ns / 1e6
        return a


class timed:
    """While entered, every call of the :data:`TIMED` parts is charged to ``timers``;
    the originals are put back on exit.  ``schedule`` also marks each engine step."""

    def __init__(self, timers: Timers, parts=TIMED) -> None:
        self.timers, self.parts, self._saved = timers, parts, []

    def __enter__(self) -> "timed":
        for label, module, cls, name in self.parts:
            owner = getattr(importlib.import_module(module), cls)
            original = owner.__dict__[name]
            self._saved.append((owner, name, original))
            setattr(owner, name, self._wrap(label, original, name == "schedule"))
        return self

    def __exit__(self, *exc) -> None:
        for owner, name, original in reversed(self._saved):
            setattr(owner, name, original)
        self._saved.clear()

    def _wrap(self, label: str, fn, marks_step: bool):
        timers, clock = self.timers, time.perf_counter_ns

        def wrapper(*args, **kwargs):
            t0 = clock()
            try:
                out = fn(*args, **kwargs)
            finally:
                if not marks_step:
                    timers.charge(label, clock() - t0)
            if marks_step:
                timers.step(out)
                timers.charge(label, clock() - t0)
            return out

        wrapper.__wrapped__ = fn
        return wrapper


# stock vLLM; the DAS engine; the DAS engine with partial rollouts (the default
# combination: its timed step is the third, with the carried samples' continuations)
ENGINES = ("stock", "das", "das+partial")

PHASES = (("full batch, no drafts", lambda w, d, full: (w >= 0.9 * full) & ~d),
          ("full batch, drafting", lambda w, d, full: (w >= 0.9 * full) & d),
          ("30-90% of it", lambda w, d, full: (w < 0.9 * full) & (w >= 0.3 * full)),
          ("below 30%", lambda w, d, full: w < 0.3 * full))


def parts_per_step(timers: Timers) -> dict[str, np.ndarray]:
    """Each row's ms per step (:data:`ROWS`): the timed parts, and the engine's whole
    update (the RL scheduler's, which runs vLLM's inside it, else vLLM's)."""
    parts = {label: timers.per_step(label) for label, *_ in TIMED}
    parts[UPDATE] = np.maximum(parts.pop("RL update_from_output"),
                               parts["vLLM's update_from_output"])
    return parts


def summarize(timers: Timers, gpu_ms: np.ndarray, full: int) -> list[dict]:
    """Per phase (:data:`PHASES`): its steps, mean batch, the forward pass's mean price
    and each row's mean ms per step."""
    w = np.asarray(timers.widths)
    d = np.asarray(timers.drafting, dtype=bool)
    n = min(len(w), len(gpu_ms))
    w, d, gpu = w[:n], d[:n], np.asarray(gpu_ms[:n])
    parts = {label: a[:n] for label, a in parts_per_step(timers).items()}
    out = []
    for name, select in PHASES:
        idx = np.flatnonzero(select(w, d, full))
        k = max(len(idx), 1)
        out.append({"phase": name, "steps": int(len(idx)),
                    "batch": float(w[idx].mean()) if len(idx) else 0.0,
                    "gpu_ms": float(gpu[idx].sum() / k),
                    "parts": {label: float(a[idx].sum() / k) for label, a in parts.items()}})
    return out


def table(phases: dict[str, list[dict]]) -> str:
    """One markdown table per phase: each part's ms per step for each engine."""
    names = list(phases)
    lines = []
    for j, first in enumerate(phases[names[0]]):
        rows = [phases[e][j] for e in names]
        lines += ["", f"**{first['phase']}** (steps: " +
                  ", ".join(f"{e} {r['steps']}" for e, r in zip(names, rows)) +
                  "; mean batch: " + ", ".join(f"{r['batch']:.0f}" for r in rows) + ")", "",
                  "| part, ms per step | " + " | ".join(names) + " |",
                  "|---|" + "---|" * len(names),
                  "| forward pass (projected) | " +
                  " | ".join(f"{r['gpu_ms']:.2f}" for r in rows) + " |",
                  "| host, top-level parts | " +
                  " | ".join(f"{sum(r['parts'][t] for t in TOP):.2f}" for r in rows) + " |"]
        for label, depth in ROWS:
            vals = [r["parts"][label] for r in rows]
            if max(vals) < 0.005:
                continue
            lines.append(f"| {'· ' * depth}{label} | " +
                         " | ".join(f"{v:.2f}" for v in vals) + " |")
    return "\n".join(lines)


def picture(phases: dict[str, list[dict]], path: Path, title: str) -> Path:
    """Per phase, each engine's top-level host parts stacked, the forward pass as a
    line over them."""
    from vllm_rl.bench.plots import _plt

    plt = _plt()
    names = list(phases)
    n_phases = len(phases[names[0]])
    fig, ax = plt.subplots(figsize=(12, 5))
    colours = plt.get_cmap("tab10").colors
    width = 0.8 / len(names)
    labelled: set[str] = set()          # each part named in the legend once, where drawn first

    def label(name: str) -> str | None:
        if name in labelled:
            return None
        labelled.add(name)
        return name

    for e, name in enumerate(names):
        for j, row in enumerate(phases[name]):
            x, bottom = j + (e - (len(names) - 1) / 2) * width, 0.0
            if not row["steps"]:
                ax.text(x, 0.5, f"{name}: no steps", ha="center", va="bottom", fontsize=8,
                        rotation=90)
                continue
            for c, part in enumerate(TOP):
                v = row["parts"][part]
                ax.bar(x, v, width * 0.9, bottom=bottom, color=colours[c % len(colours)],
                       label=label(part))
                bottom += v
            ax.hlines(row["gpu_ms"], x - width * 0.45, x + width * 0.45, colors="black",
                      linewidth=2, label=label("forward pass (projected)"))
            ax.text(x, 0.5, name, ha="center", va="bottom", fontsize=8, rotation=90,
                    color="white")
    ax.set_xticks(range(n_phases), [r["phase"] for r in phases[names[0]]])
    ax.set_ylabel("ms per engine step")
    ax.set_title(title, fontsize=9, wrap=True)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))   # off the bars
    ax.margins(y=0.25)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def groups_per_second(groups: int, projection) -> dict:
    """The complete groups a step delivered, per projected second: on the forward passes
    alone and with the host time counted as the engine schedules."""
    gpu_s = projection.gpu_ms / 1e3
    host_s = (projection.host_counted_ms or projection.gpu_ms) / 1e3
    return {"groups": groups, "gpu_s": gpu_s, "host_counted_s": host_s,
            "per_gpu_s": groups / gpu_s if gpu_s else 0.0,
            "per_host_counted_s": groups / host_s if host_s else 0.0}


def delivered_table(delivered: dict[str, dict]) -> str:
    """Complete groups per projected second, each engine against stock: a partial step
    trains only the groups it completes, so its speed is groups delivered, not time."""
    base = delivered.get("stock")
    lines = ["| engine | complete groups | projected s, GPU-only | with host | groups/s "
             "(vs stock), GPU-only | groups/s (vs stock), host counted |",
             "|---|---|---|---|---|---|"]
    for name, d in delivered.items():
        rel = ((f" ({d['per_gpu_s'] / base['per_gpu_s']:.2f}×)",
                f" ({d['per_host_counted_s'] / base['per_host_counted_s']:.2f}×)")
               if base and base["per_gpu_s"] and base["per_host_counted_s"] else ("", ""))
        lines.append(f"| {name} | {d['groups']} | {d['gpu_s']:.2f} | {d['host_counted_s']:.2f}"
                     f" | {d['per_gpu_s']:.1f}{rel[0]} | {d['per_host_counted_s']:.1f}{rel[1]} |")
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="vllm-rl bench host-parts",
                                 description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=256, help="held-out prompts (default 256: "
                    "2,048 samples through 1,024 slots, so requests come and go every step)")
    ap.add_argument("--m", type=int, default=8, help="samples per prompt (default 8)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    from vllm_rl.task.kits import add_argument as add_task_argument

    add_task_argument(ap)
    ap.add_argument("--cost", default="h100:qwen3-8b",
                    help="the step-cost table the forward passes are priced on, and the DAS "
                         "engine plans with")
    ap.add_argument("--kv-gib", type=float, default=4.0, help="KV cache per engine, GiB")
    ap.add_argument("--engines", default=",".join(ENGINES),
                    help=f"which of {', '.join(ENGINES)} (default all)")
    ap.add_argument("--out", default="results/host-parts")
    return ap


def main(argv: list[str] | None = None) -> dict:
    args = parser().parse_args(argv)
    from vllm_rl.bench.engines import GPU_LIMITS, in_process

    in_process()
    from vllm import SamplingParams

    from vllm_rl import rl_params
    from vllm_rl.bench.engines import rl_engine, shutdown, stock_engine
    from vllm_rl.bench.logs import provenance, vllm_log_to
    from vllm_rl.bench.step.run import drive as _drive
    from vllm_rl.cost import load_cost
    from vllm_rl.engine.trace import engine_trace
    from vllm_rl.task import kit

    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    vllm_log_to(out_dir / "vllm.log")
    task = kit(args.task)
    model, context = str(task.model_path), max(1024, task.max_model_len)
    prompts, cost = task.heldout_prompts(args.prompts), load_cost(args.cost)
    full = GPU_LIMITS["max_num_seqs"]
    kv = int(args.kv_gib * (1 << 30))

    def params(das: bool, seed: int) -> list:
        return [SamplingParams(n=args.m, temperature=1.0, max_tokens=args.max_tokens,
                               seed=seed + 7919 * i,
                               extra_args=rl_params(das={"problem_id": p}) if das else None)
                for i, p in enumerate(prompts)]

    def timed_step(name: str, llm, timers: Timers):
        """The engine's timed step, after its untimed ones: its trace mark and the
        complete groups it delivers.  Partial rollouts run as ``vllm-rl bench step`` runs
        them (:func:`vllm_rl.bench.step.run.run_once`): two untimed steps fill the carry
        buffer and the DAS trees, the third is timed, and it delivers only the groups it
        completes."""
        trace = engine_trace(llm)
        if name != "das+partial":
            _drive(llm, f"{name}-warm-up", params(name != "stock", args.seed + 99), prompts, 0)
            mark = trace.mark()
            with timed(timers):
                _drive(llm, name, params(name != "stock", args.seed), prompts, 1)
            return trace, mark, len(prompts)
        from vllm_rl.bench.matrix import partial_setting
        from vllm_rl.integrations.common.partial import CarryBuffer, PartialConfig

        cfg, buffer = PartialConfig(**partial_setting(name)), CarryBuffer()
        for step in range(3):
            launched = buffer.launch(cfg, step, prompts,
                                     params(True, args.seed + 1_000_003 * (2 - step)),
                                     args.max_tokens, 1.0)
            mark = trace.mark()
            if step < 2:
                outs, _ = _drive(llm, f"{name}-s{step}", launched.params, launched.prompts, 0)
            else:
                with timed(timers):
                    outs, _ = _drive(llm, name, launched.params, launched.prompts, 1)
            complete = buffer.finish(launched, outs)
        return trace, mark, len(complete)

    phases, steps, delivered = {}, {}, {}
    for name in [e for e in args.engines.split(",") if e]:
        if name not in ENGINES:
            raise SystemExit(f"host-parts: unknown engine {name!r}; choose from {ENGINES}")
        print(f"[host-parts] {name}: engine, untimed step(s), timed step", flush=True)
        llm = (stock_engine(model, args.seed, True, kv, context) if name == "stock" else
               rl_engine(model, args.seed, True, kv, context, cost=args.cost))
        timers = Timers()
        try:
            trace, mark, groups = timed_step(name, llm, timers)
            projection = trace.since(mark).project(cost)
            gpu = np.asarray(projection.per_step_ms)
        finally:
            shutdown(llm)
        phases[name] = summarize(timers, gpu, full)
        steps[name] = {"widths": timers.widths, "drafting": timers.drafting,
                       "gpu_ms": gpu.tolist(),
                       "parts": {label: a.tolist()
                                 for label, a in parts_per_step(timers).items()}}
        delivered[name] = groups_per_second(groups, projection)
    text = table(phases) + "\n\n" + delivered_table(delivered)
    title = (f"{args.prompts} prompts x {args.m}, max_tokens {args.max_tokens}: host time per "
             f"engine step by part\nforward pass projected on {args.cost}")
    print(f"\n{title}\n{text}")
    result = {"args": vars(args), "provenance": provenance(), "phases": phases,
              "steps": steps, "delivered": delivered}
    (out_dir / "host-parts.json").write_text(json.dumps(result))
    png = picture(phases, out_dir / "host-parts.png", title)
    print(f"\nresults: {out_dir / 'host-parts.json'}\npicture: {png}\n"
          f"vLLM's log: {out_dir / 'vllm.log'}")
    return result


if __name__ == "__main__":
    main()
