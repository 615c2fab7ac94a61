"""The host-budget figures of ``vllm-rl bench overhead``: pure functions, no engine.

A *run* is one workload at one live-sequence count on one engine (stock vLLM or the RL
engine), as the worker sends it back (:mod:`vllm_rl.bench.overhead.host`): per engine step its live
sequences (the sequences it scheduled), its scheduled tokens, whether it was a decode
step (every sequence past its prompt), and its host times in ns from the step trace
(:class:`vllm_rl.engine.trace.StepTrace`): ``schedule_ns``, ``update_ns``,
``drafter_ns``, ``scorer_ns``.

* :func:`run_figures`: a run's figures over its *window*: the decode steps after the first
  ``skip`` ones (warm-up) in which at least ``floor`` × the target count was live.  Every
  figure per request-step is the window's summed time over its summed live sequences
  (a step with 1,024 live counts 1,024 request-steps).  Prefill steps are reported apart.
* :func:`summarize`: per (live count, workload), medians over repeats of both engines'
  figures and of the paired ratio RL / stock (same repeat), with their spread.
* :func:`check_budgets`: the issue's budgets, pass or fail per row.
* :func:`table`, :func:`document`, :func:`picture`: the printed table, the JSON and the PNG.
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

#: budgets (issue, deliverable 4)
SCHED_RATIO_BUDGET = 1.25      # RL schedule+update over vLLM's, flagged requests
DRAFTER_US_BUDGET = 3.0        # DAS drafting, tree updates included, µs / request-step
FLAGLESS_NOISE_FLOOR = 0.05    # "within noise": at least ±5%, wider if stock's own repeats spread more

_NS_KEYS = ("schedule_ns", "update_ns", "drafter_ns", "scorer_ns")


def _div(a: float, b: float) -> float | None:
    return a / b if b else None


def _sum(*xs: float | None) -> float | None:
    return None if any(x is None for x in xs) else sum(xs)


def run_figures(run: Mapping[str, Any], target: int, floor: float = 0.9,
                skip: int = 2, outlier: float = 10.0) -> dict[str, Any]:
    """A run's figures in µs (module docstring).  ``run`` holds per-step lists ``live``,
    ``tokens``, ``decode`` and the four ``*_ns``, and optionally ``scored_rows`` (rows the
    ARRoL scorer scored in the whole run).

    ``outlier`` (0: off): a window step whose schedule+update time per live request
    exceeds ``outlier`` × the window's median is left out of the schedule and update
    figures, and likewise for the drafter: on a shared machine such a step is the
    process descheduled (hundreds of ms), not work.  The scorer is never filtered (its
    ``l_detect`` step is a spike by design).  ``outliers`` counts the steps left out."""
    live = list(run["live"])
    n = len(live)
    ns = {k: list(run.get(k) or [0] * n) for k in _NS_KEYS}
    for k, v in ns.items():           # an output not back yet counts 0
        ns[k] = (v + [0] * n)[:n]
    decode = list(run.get("decode") or [True] * n)
    tokens = list(run.get("tokens") or live)
    decode_idx = [i for i in range(n) if decode[i]]
    window = [i for i in decode_idx[skip:] if live[i] >= floor * target]
    prefill = [i for i in range(n) if not decode[i]]

    def per_req_step(idx: list[int], keys: Sequence[str]) -> float | None:
        seqs = sum(live[i] for i in idx)
        return _div(sum(ns[k][i] for k in keys for i in idx) / 1e3, seqs)

    def kept(keys: Sequence[str]) -> list[int]:
        if not outlier or not window:
            return window
        per = [sum(ns[k][i] for k in keys) / max(live[i], 1) for i in window]
        cut = outlier * statistics.median(per)
        return [i for i, x in zip(window, per) if x <= cut or cut <= 0]

    core_w, draft_w = kept(("schedule_ns", "update_ns")), kept(("drafter_ns",))
    w_live = sum(live[i] for i in window)
    scored = run.get("scored_rows")
    scorer_all = sum(ns["scorer_ns"])
    return {
        "steps": n, "decode_steps": len(decode_idx), "window_steps": len(window),
        "window_mean_live": _div(w_live, len(window)),
        "window_tokens_per_req_step": _div(sum(tokens[i] for i in window), w_live),
        "schedule_us": per_req_step(core_w, ("schedule_ns",)),
        "update_us": per_req_step(core_w, ("update_ns",)),
        "core_us": per_req_step(core_w, ("schedule_ns", "update_ns")),
        "drafter_us": per_req_step(draft_w, ("drafter_ns",)),
        "scorer_us": per_req_step(window, ("scorer_ns",)),
        "outliers": {"core": len(window) - len(core_w), "drafter": len(window) - len(draft_w)},
        "core_us_unfiltered": per_req_step(window, ("schedule_ns", "update_ns")),
        "host_us": _sum(per_req_step(core_w, ("schedule_ns", "update_ns")),
                        per_req_step(draft_w, ("drafter_ns",)),
                        per_req_step(window, ("scorer_ns",))),
        "scorer_us_per_step": _div(sum(ns["scorer_ns"][i] for i in window) / 1e3, len(window)),
        "scorer_us_per_row": _div(scorer_all / 1e3, scored) if scored else None,
        "scored_rows": scored,
        "prefill_steps": len(prefill),
        "prefill_core_us": per_req_step(prefill, ("schedule_ns", "update_ns")),
    }


def _stats(xs: Sequence[float | None]) -> dict[str, float] | None:
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    if not xs:
        return None
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


FIGURES = ("core_us", "schedule_us", "update_us", "drafter_us", "scorer_us", "host_us",
           "scorer_us_per_step", "scorer_us_per_row", "window_mean_live",
           "window_tokens_per_req_step", "prefill_core_us", "window_steps")


def summarize(runs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per (live, workload): each engine's figures (median, min, max over repeats)
    and the paired ratios of the same repeat: ``core_ratio`` (RL schedule+update over
    vLLM's) and ``host_ratio`` (RL schedule+update+drafter+scorer over vLLM's
    schedule+update).  ``runs`` are dicts with ``engine``, ``workload``, ``live``,
    ``repeat`` and ``figures`` (:func:`run_figures`)."""
    keys: list[tuple[int, str]] = []
    by: dict[tuple[int, str, str], dict[int, Mapping[str, Any]]] = {}
    for r in runs:
        key = (r["live"], r["workload"])
        if key not in keys:
            keys.append(key)
        by.setdefault((*key, r["engine"]), {})[r["repeat"]] = r["figures"]
    rows = []
    for live, workload in sorted(keys, key=lambda k: (k[0], keys.index(k))):
        stock = by.get((live, workload, "stock"), {})
        rl = by.get((live, workload, "rl"), {})
        row: dict[str, Any] = {"live": live, "workload": workload,
                               "repeats": len(set(stock) & set(rl))}
        for engine, figs in (("stock", stock), ("rl", rl)):
            row[engine] = {f: _stats([x.get(f) for x in figs.values()]) for f in FIGURES}
        for name, num in (("core_ratio", "core_us"), ("host_ratio", "host_us")):
            row[name] = _stats([_div(rl[k][num], stock[k]["core_us"])
                                if rl[k].get(num) is not None
                                and stock[k].get("core_us") is not None else None
                                for k in sorted(set(stock) & set(rl))])
        rows.append(row)
    return rows


def _med(row: Mapping[str, Any], engine: str, fig: str) -> float | None:
    s = (row.get(engine) or {}).get(fig)
    return s["median"] if s else None


def flagless_tolerance(row: Mapping[str, Any]) -> float:
    """"Within noise" for a flagless row: stock's own spread over repeats (max − min over
    its median, of schedule+update per request-step), at least
    :data:`FLAGLESS_NOISE_FLOOR`."""
    s = (row.get("stock") or {}).get("core_us")
    spread = (s["max"] - s["min"]) / s["median"] if s and s["median"] else 0.0
    return max(FLAGLESS_NOISE_FLOOR, spread)


def check_budgets(row: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The budgets that apply to a row, each ``{"limit", "value", "pass", "what"}``
    (``pass`` None where there is no figure):

    * flagless: the RL engine's whole host time (schedule, update, drafter, scorer) per
      request-step over vLLM's schedule+update, median of paired ratios, at most
      ``1 + tolerance`` (:func:`flagless_tolerance`);
    * flagged: RL schedule+update over vLLM's, median of paired ratios, at most 1.25;
    * DAS rows (``das``, ``all``): drafter µs per request-step at most 3.

    DUET's (token-id marker check, no tokenizer in EngineCore) and ARRoL's (no host-device
    sync, one fused reduction) budgets are properties of the code, not of a time: their
    rows carry the schedule+update ratio and the scorer's time, reported, not judged."""
    out: dict[str, dict[str, Any]] = {}
    workload = row["workload"]

    def judge(value: float | None, limit: float) -> bool | None:
        return None if value is None else value <= limit

    if workload == "flagless":
        tol = flagless_tolerance(row)
        ratio = (row.get("host_ratio") or {}).get("median")
        out["flagless"] = {"limit": 1 + tol, "value": ratio, "pass": judge(ratio, 1 + tol),
                           "what": "RL host (sched+update+drafter+scorer) / vLLM sched+update"}
    else:
        ratio = (row.get("core_ratio") or {}).get("median")
        out["scheduler"] = {"limit": SCHED_RATIO_BUDGET, "value": ratio,
                            "pass": judge(ratio, SCHED_RATIO_BUDGET),
                            "what": "RL sched+update / vLLM sched+update"}
    if workload in ("das", "all"):
        d = _med(row, "rl", "drafter_us")
        out["drafter"] = {"limit": DRAFTER_US_BUDGET, "value": d,
                          "pass": judge(d, DRAFTER_US_BUDGET),
                          "what": "DAS drafter µs / request-step"}
    return out


# ----------------------------------------------------------------------------- report

def _f(x: float | None, fmt: str = "{:.2f}") -> str:
    return "–" if x is None else fmt.format(x)


def _verdict(b: Mapping[str, Any] | None) -> str:
    if not b:
        return "–"
    mark = {True: "pass", False: "FAIL", None: "–"}[b["pass"]]
    return f"{mark} (≤ {b['limit']:.2f})" if b["pass"] is not None else "–"


TABLE_HEAD = ("live", "workload", "vLLM sched+upd µs/req-step", "RL sched+upd µs/req-step",
              "RL / vLLM (min–max)", "sched. budget", "RL drafter µs/req-step",
              "drafter ≤ 3", "RL scorer µs/step", "RL scorer µs/row", "RL host / vLLM",
              "mean live (vLLM / RL)", "window steps (vLLM / RL)")


def table(rows: Sequence[Mapping[str, Any]]) -> str:
    """A markdown table, one row per (live, workload); medians over repeats."""
    lines = ["| " + " | ".join(TABLE_HEAD) + " |", "|" + "---|" * len(TABLE_HEAD)]
    for r in rows:
        b = r.get("budgets") or check_budgets(r)
        cr, hr = r.get("core_ratio"), r.get("host_ratio")
        ratio = "–" if not cr else f"{cr['median']:.3f} ({cr['min']:.2f}–{cr['max']:.2f})"
        sched = b.get("flagless") or b.get("scheduler")
        if "flagless" in b:          # judged on the whole host time
            sched_txt = f"{_verdict(sched)} host"
        else:
            sched_txt = _verdict(sched)
        cells = [str(r["live"]), r["workload"], _f(_med(r, "stock", "core_us")),
                 _f(_med(r, "rl", "core_us")), ratio, sched_txt,
                 _f(_med(r, "rl", "drafter_us"), "{:.3f}"), _verdict(b.get("drafter")),
                 _f(_med(r, "rl", "scorer_us_per_step"), "{:.0f}"),
                 _f(_med(r, "rl", "scorer_us_per_row"), "{:.2f}"),
                 "–" if not hr else f"{hr['median']:.3f}",
                 f"{_f(_med(r, 'stock', 'window_mean_live'), '{:.0f}')} / "
                 f"{_f(_med(r, 'rl', 'window_mean_live'), '{:.0f}')}",
                 f"{_f(_med(r, 'stock', 'window_steps'), '{:.0f}')} / "
                 f"{_f(_med(r, 'rl', 'window_steps'), '{:.0f}')}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def document(args: Mapping[str, Any], engines: Mapping[str, Any],
             runs: Sequence[Mapping[str, Any]], extra: Mapping[str, Any] | None = None
             ) -> dict[str, Any]:
    """The JSON: settings, engines, one row per (live, workload) with its budgets, and
    every run (figures and raw per-step arrays)."""
    rows = summarize(runs)
    for r in rows:
        r["budgets"] = check_budgets(r)
    verdicts = [b["pass"] for r in rows for b in r["budgets"].values()]
    return {"mode": "host", "args": dict(args), "engines": dict(engines),
            "budgets": {"scheduler_ratio": SCHED_RATIO_BUDGET,
                        "drafter_us": DRAFTER_US_BUDGET,
                        "flagless_noise_floor": FLAGLESS_NOISE_FLOOR},
            "all_pass": all(v is True for v in verdicts) if verdicts else None,
            "rows": rows, "runs": list(runs), **(extra or {})}


def picture(rows: Sequence[Mapping[str, Any]], path: str | Path, title: str) -> Path | None:
    """Bars at the largest live count: per workload, vLLM's schedule+update and the RL
    engine's (schedule+update, then drafter and scorer stacked), µs per request-step,
    min–max over repeats as error bars, and a tick at 1.25 × vLLM's (the budget)."""
    if not rows:
        return None
    from vllm_rl.bench.plots import _plt

    top = max(r["live"] for r in rows)
    rows = [r for r in rows if r["live"] == top]
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 5.4), dpi=120)
    xs = list(range(len(rows)))
    w = 0.38

    def err(engine: str, fig_: str) -> tuple[list[float], list[float]]:
        lo, hi = [], []
        for r in rows:
            s = (r.get(engine) or {}).get(fig_)
            lo.append(s["median"] - s["min"] if s else 0.0)
            hi.append(s["max"] - s["median"] if s else 0.0)
        return lo, hi

    stock = [_med(r, "stock", "core_us") or 0.0 for r in rows]
    core = [_med(r, "rl", "core_us") or 0.0 for r in rows]
    drafter = [_med(r, "rl", "drafter_us") or 0.0 for r in rows]
    scorer = [_med(r, "rl", "scorer_us") or 0.0 for r in rows]
    ax.bar([x - w / 2 for x in xs], stock, w, yerr=err("stock", "core_us"), capsize=3,
           color="#777777", label="vLLM: schedule + update")
    ax.bar([x + w / 2 for x in xs], core, w, yerr=err("rl", "core_us"), capsize=3,
           color="#0072B2", label="RL: schedule + update")
    ax.bar([x + w / 2 for x in xs], drafter, w, bottom=core, color="#009E73",
           label="RL: DAS drafter")
    ax.bar([x + w / 2 for x in xs], scorer, w, bottom=[c + d for c, d in zip(core, drafter)],
           color="#E69F00", label="RL: ARRoL scorer")
    for x, s, r in zip(xs, stock, rows):
        if s and r["workload"] != "flagless":
            ax.hlines(SCHED_RATIO_BUDGET * s, x + 0.02, x + w + 0.02 - 0.04, colors="#D55E00",
                      linewidth=2)
    ax.plot([], [], color="#D55E00", linewidth=2,
            label=f"budget: {SCHED_RATIO_BUDGET:g} × vLLM (schedule + update)")
    for x, r in zip(xs, rows):
        cr = r.get("core_ratio")
        if cr:
            hi = ((r.get("rl") or {}).get("core_us") or {}).get("max") or 0.0
            top_y = max(core[x] + drafter[x] + scorer[x], hi)
            ax.annotate(f"{cr['median']:.2f}×", (x + w / 2, top_y), xytext=(0, 3),
                        textcoords="offset points", ha="center", fontsize=8)
    ax.set_xticks(xs, [r["workload"] for r in rows])
    ax.set_ylabel("host µs per request-step")
    ax.set_xlabel("workload (label: RL / vLLM schedule+update, median of paired repeats)",
                  fontsize=8)
    ax.set_title(title, fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=3,
              framealpha=0.9)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path


__all__ = ["DRAFTER_US_BUDGET", "SCHED_RATIO_BUDGET", "check_budgets", "document",
           "flagless_tolerance", "picture", "run_figures", "summarize", "table"]
