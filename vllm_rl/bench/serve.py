"""``vllm-rl serve-bench``: RL-shaped load against running OpenAI-compatible servers.

    vllm-rl serve-bench --base-url http://localhost:8000 --techniques darts,duet
    vllm-rl serve-bench --base-url http://localhost:8000 http://localhost:8001 \\
        --labels rl,stock --concurrency 16,64,inf

The workload is one rollout step: N prompts x M samples, each group sent as one request
with ``n = M`` (``--group-as n``) or as M single requests sharing a group id
(``--group-as single``, verl's way), streamed from ``/v1/completions``.  The same
workload runs against every server given (this project's ``vllm-rl serve`` and stock
``vllm serve`` / ``vllm-rl serve --stock``), at each concurrency level of the sweep
(``--concurrency``: most requests in flight; ``inf``: all at once) or at a Poisson
request rate (``--request-rate``).  The technique flags (``--techniques``) go in
``vllm_xargs``; a stock server ignores them.

Measured per sample (a choice of an ``n`` request, or a single request): TTFT, TPOT, ITL
and end-to-end latency from the stream's chunks; per group: completion time from its
first send; per run: the makespan of the step and the output tokens per second.  The
JSON uses ``vllm bench serve``'s field names where the meaning is the same
(``request_throughput``, ``output_throughput``, ``mean_ttft_ms``, ``p99_itl_ms``, ...;
here a "request" is an HTTP request), plus the RL fields (``samples_by_reason``,
``kept_samples``, ``selected_samples``, ``duet_weights``, ``draft_accepted``, ...) read
from each sample's record (:meth:`vllm_rl.RolloutInfo.from_openai_choice`).  PNGs beside
it: the length CDF and the running requests over the step, one line per run.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from vllm_rl.task.problems import ANSWER_PATTERN as TASK_MARKER

PERCENTILES = (50, 90, 99)
TECHNIQUES = ("darts", "duet", "das", "arrol")


def parser() -> argparse.ArgumentParser:
    parts = __doc__.replace("``", "").replace("\\\n", "\\\n").split("\n\n")
    ap = argparse.ArgumentParser(
        prog="vllm-rl serve-bench", formatter_class=argparse.RawDescriptionHelpFormatter,
        description=parts[0].split(": ", 1)[1] + "\n\n" + "\n\n".join(parts[2:]),
        epilog="examples:\n" + parts[1])
    ap.add_argument("--base-url", nargs="+", default=["http://127.0.0.1:8000"],
                    help="server(s) to measure with the same workload (default "
                         "http://127.0.0.1:8000)")
    ap.add_argument("--labels", default=None,
                    help="comma-separated names of the servers (default: their host:port)")
    ap.add_argument("--model", default=None,
                    help="model name in requests (default: each server's first /v1/models)")
    ap.add_argument("--prompts", type=int, default=16,
                    help="N: prompts (groups) in the step (default 16; the embedded task's "
                         "held-out prompts, or --prompt-file)")
    ap.add_argument("--prompt-file", default=None,
                    help="a text file with one prompt per line, instead of the task's prompts")
    ap.add_argument("--samples", type=int, default=8,
                    help="M: samples generated per prompt (default 8)")
    ap.add_argument("--group-as", choices=("n", "single"), default="n",
                    help="a group is one request with n = M (default), or M single requests "
                         "sharing a group id")
    ap.add_argument("--max-tokens", type=int, default=None,
                    help="(default: the kit's limit, 256 or 1,024)")
    from vllm_rl.task.kits import add_argument as add_task_argument

    add_task_argument(ap)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0, help="sampling seed base (per sample)")
    ap.add_argument("--techniques", default="",
                    help=f"comma-separated among {', '.join(TECHNIQUES)} (default none: plain "
                         "requests, the stock workload)")
    ap.add_argument("--keep", type=int, default=None,
                    help="darts: M kept per group (group.size); default M/2")
    ap.add_argument("--darts-mode", choices=("shortest", "dual_end", "auto"),
                    default="shortest")
    ap.add_argument("--duet", default=None, metavar="JSON",
                    help="duet flags (default: the embedded task's marker, "
                         '{"pattern": "\\\\boxed\\{[^}]*\\}", "eps": 0.05})')
    ap.add_argument("--arrol", default=None, metavar="JSON",
                    help='arrol flags (default {"l_detect": 16})')
    ap.add_argument("--das", default=None, metavar="JSON",
                    help="das flags (default: problem_id = the prompt's index)")
    ap.add_argument("--flags", default=None, metavar="JSON",
                    help="raw vllm_rl flags merged over the above (rl_params sections)")
    ap.add_argument("--concurrency", default="inf",
                    help="comma-separated sweep of most requests in flight (inf = all at "
                         "once; default inf)")
    ap.add_argument("--request-rate", type=float, default=None,
                    help="send at a Poisson rate of this many requests/s instead of a "
                         "concurrency sweep")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
    ap.add_argument("--out", default="bench-results",
                    help="folder for serve-bench-<time>.json and the PNGs")
    ap.add_argument("--no-plots", action="store_true", help="write no PNGs")
    return ap


# ----------------------------------------------------------------------------- workload
@dataclass
class Req:
    """One HTTP request of the workload: a whole group (n = M) or one of its samples."""

    group: int
    prompt: str
    n: int
    seed: int
    xargs: dict | None


def technique_flags(args, i: int) -> dict:
    """The rl_params sections of group ``i`` for the chosen techniques."""
    names = [t for t in args.techniques.split(",") if t]
    unknown = set(names) - set(TECHNIQUES)
    if unknown:
        raise SystemExit(f"vllm-rl serve-bench: unknown technique(s) {sorted(unknown)}; "
                         f"choose from {', '.join(TECHNIQUES)}")
    flags: dict = {}
    if args.group_as == "single" or "darts" in names:
        flags["group"] = {"id": f"serve-bench-{args.seed}-{i}", "redundant": args.samples,
                          "size": args.keep or max(1, args.samples // 2)
                          if "darts" in names else args.samples}
    if "darts" in names:
        flags["darts"] = {"mode": args.darts_mode}
    if "duet" in names:
        flags["duet"] = json.loads(args.duet) if args.duet else {"pattern": TASK_MARKER,
                                                                 "eps": 0.05}
    if "das" in names:
        flags["das"] = json.loads(args.das) if args.das else {"problem_id": f"p{i}"}
    if "arrol" in names:
        flags["arrol"] = json.loads(args.arrol) if args.arrol else {"l_detect": 16}
    for key, value in (json.loads(args.flags) if args.flags else {}).items():
        flags[key] = {**flags.get(key, {}), **value}
    return flags


def workload(args, prompts: list[str]) -> list[Req]:
    from vllm_rl import rl_xargs

    reqs = []
    for i, prompt in enumerate(prompts):
        flags = technique_flags(args, i)
        xargs = rl_xargs(**flags) if flags else None
        if args.group_as == "n":
            reqs.append(Req(i, prompt, args.samples, args.seed + 1000 * i, xargs))
        else:
            reqs += [Req(i, prompt, 1, args.seed + 1000 * i + j, xargs)
                     for j in range(args.samples)]
    return reqs


# ----------------------------------------------------------------------------- client
@dataclass
class Sample:
    """One generated sample as the client saw it (times in s from the run's start)."""

    group: int
    start: float
    ttft: float | None = None
    end: float | None = None
    chunk_times: list[float] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    stop_reason: object = None
    rollout_info: dict | None = None      # the record on the choice's final chunk
    error: str | None = None


async def send(session, url: str, model: str, req: Req, args, t0: float) -> list[Sample]:
    """Stream one completion request; one :class:`Sample` per choice."""
    body = {"model": model, "prompt": req.prompt, "n": req.n, "max_tokens": args.max_tokens,
            "temperature": args.temperature, "seed": req.seed, "stream": True,
            "return_token_ids": True}
    if req.xargs:
        body["vllm_xargs"] = req.xargs
    start = time.perf_counter() - t0
    samples = {i: Sample(req.group, start) for i in range(req.n)}
    try:
        async with session.post(url + "/v1/completions", json=body) as resp:
            if resp.status != 200:
                err = (await resp.text())[:500]
                for s in samples.values():
                    s.error, s.end = f"HTTP {resp.status}: {err}", time.perf_counter() - t0
                return list(samples.values())
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                now = time.perf_counter() - t0
                msg = json.loads(data)
                if "error" in msg:
                    for s in samples.values():
                        s.error = json.dumps(msg["error"])[:500]
                    break
                for c in msg.get("choices", []):
                    s = samples[c["index"]]
                    ids = c.get("token_ids") or []
                    if ids or c.get("text"):
                        if s.ttft is None:
                            s.ttft = now - s.start
                        s.chunk_times.append(now)
                        s.token_ids += ids
                        s.text += c.get("text") or ""
                    if c.get("finish_reason") is not None:
                        s.finish_reason, s.stop_reason, s.end = (
                            c["finish_reason"], c.get("stop_reason"), now)
                        s.rollout_info = c.get("rollout_info")
    except Exception as e:          # connection dropped, timeout: recorded, never fatal
        for s in samples.values():
            s.error = f"{type(e).__name__}: {e}"
    for s in samples.values():
        if s.end is None:
            s.end = time.perf_counter() - t0
    return list(samples.values())


async def run_level(url: str, model: str, reqs: list[Req], args, concurrency: float,
                    rate: float | None, bar) -> tuple[list[Sample], float]:
    """All requests of the step at one concurrency level (or rate): (samples, makespan)."""
    import aiohttp

    limit = 0 if math.isinf(concurrency) else int(concurrency)
    sem = asyncio.Semaphore(limit) if limit else None
    timeout = aiohttp.ClientTimeout(total=args.timeout)
    rng = random.Random(args.seed)
    async with aiohttp.ClientSession(timeout=timeout,
                                     connector=aiohttp.TCPConnector(limit=limit)) as session:
        t0 = time.perf_counter()

        async def one(req: Req, delay: float):
            if delay:
                await asyncio.sleep(delay)
            if sem is None:
                out = await send(session, url, model, req, args, t0)
            else:
                async with sem:
                    out = await send(session, url, model, req, args, t0)
            bar.update(1)
            return out

        delays, t = [], 0.0
        for _ in reqs:
            delays.append(t)
            if rate:
                t += rng.expovariate(rate)
        results = await asyncio.gather(*(one(r, d) for r, d in zip(reqs, delays)))
        makespan = time.perf_counter() - t0
    return [s for group in results for s in group], makespan


# ----------------------------------------------------------------------------- metrics
def _pcts(prefix: str, unit_ms: bool, values: list[float]) -> dict[str, float]:
    scale = 1000.0 if unit_ms else 1.0
    suffix = "_ms" if unit_ms else "_s"
    if not values:
        return {}
    vs = sorted(v * scale for v in values)
    out = {f"mean_{prefix}{suffix}": statistics.fmean(vs),
           f"median_{prefix}{suffix}": statistics.median(vs),
           f"std_{prefix}{suffix}": statistics.pstdev(vs)}
    for p in PERCENTILES:
        out[f"p{p}_{prefix}{suffix}"] = _percentile(vs, p)
    return out


def _percentile(sorted_values: list[float], p: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    k = (len(sorted_values) - 1) * p / 100
    lo, hi = math.floor(k), math.ceil(k)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (k - lo)


def metrics(samples: list[Sample], makespan: float, n_requests: int, args,
            techniques: list[str]) -> dict:
    """``vllm bench serve``-style fields plus the RL ones, for one run."""
    from vllm_rl import RolloutInfo

    ok = [s for s in samples if s.error is None]
    infos = [RolloutInfo.from_openai_choice({"stop_reason": s.stop_reason,
                                             "finish_reason": s.finish_reason,
                                             "rollout_info": s.rollout_info,
                                             "token_ids": s.token_ids}) for s in ok]
    if "darts" in techniques:      # the training-group marks, as vllm_rl.LLM adds them
        infos = _annotate_darts(infos, ok, args)
    out_tokens = [len(s.token_ids) for s in ok]
    ttft = [s.ttft for s in ok if s.ttft is not None]
    e2e = [s.end - s.start for s in ok]
    tpot = [(s.end - s.start - s.ttft) / (n - 1) for s, n in zip(ok, out_tokens)
            if n > 1 and s.ttft is not None]
    itl = [b - a for s in ok for a, b in zip(s.chunk_times, s.chunk_times[1:])]
    groups: dict[int, list[Sample]] = {}
    for s in ok:
        groups.setdefault(s.group, []).append(s)
    group_done = [max(x.end for x in g) - min(x.start for x in g) for g in groups.values()]
    reasons: dict[str, int] = {}
    for info in infos:
        reasons[info.reason.value] = reasons.get(info.reason.value, 0) + 1
    weights = [info.weight for info in infos]
    total_out = sum(out_tokens)
    result = {
        "duration": makespan, "makespan_s": makespan,
        "completed": len({id(s) for s in ok}) if args.group_as == "single"
        else n_requests - len({s.group for s in samples if s.error}),
        "failed": sum(1 for s in samples if s.error),
        "num_requests": n_requests, "num_samples": len(samples),
        "total_output_tokens": total_out,
        "request_throughput": n_requests / makespan if makespan else 0.0,
        "sample_throughput": len(ok) / makespan if makespan else 0.0,
        "output_throughput": total_out / makespan if makespan else 0.0,
        **_pcts("ttft", True, ttft), **_pcts("tpot", True, tpot), **_pcts("itl", True, itl),
        **_pcts("e2el", True, e2e), **_pcts("group_completion", False, group_done),
        "mean_output_len": statistics.fmean(out_tokens) if out_tokens else 0.0,
        # RL fields, from the records
        "samples_by_reason": reasons,
        "kept_samples": sum(w > 0 for w in weights),
        "selected_samples": sum(bool(i.selected) for i in infos),
        "kept_output_tokens": sum(n for n, w in zip(out_tokens, weights) if w > 0),
        "duet_weights": {str(w): weights.count(w) for w in sorted(set(weights))},
        "draft_proposed": sum(i.draft_proposed or 0 for i in infos),
        "draft_accepted": sum(i.draft_accepted or 0 for i in infos),
        "arrol_pruned": sum(bool(i.pruned) for i in infos),
        "records": sum(i.group_id is not None or i.reason.value not in ("eos", "stop",
                                                                         "length", "abort")
                       for i in infos),
        "errors": sorted({s.error for s in samples if s.error})[:5],
    }
    if result["draft_proposed"]:
        result["draft_acceptance"] = result["draft_accepted"] / result["draft_proposed"]
    return result


def _annotate_darts(infos, ok: list[Sample], args) -> list:
    """Each group's DARTS training group marked (``selected``, weight 1; others weight 0)
    from the flags it was sent with, as ``vllm_rl.LLM.generate`` does offline."""
    from vllm_rl import rl_params
    from vllm_rl.flags import read
    from vllm_rl.darts.rule import annotate_group

    n = args.samples if args.group_as == "n" else 1
    by_group: dict[int, list[int]] = {}
    for idx, s in enumerate(ok):
        by_group.setdefault(s.group, []).append(idx)
    out = list(infos)
    for group, idxs in by_group.items():
        flags = read(rl_params(**technique_flags(args, group)), n=n,
                     default_group_id=infos[idxs[0]].group_id)
        marked = annotate_group([infos[i] for i in idxs], flags.group.size, flags.darts.k,
                                flags.darts.early_stop(flags.group))
        for idx, info in zip(idxs, marked):
            out[idx] = info
    return out


# ----------------------------------------------------------------------------- main
def _first_model(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url + "/v1/models", timeout=30) as r:
        return json.loads(r.read())["data"][0]["id"]


def _prompts(args) -> list[str]:
    if args.prompt_file:
        lines = [x.rstrip("\n") for x in open(args.prompt_file) if x.strip()]
        return (lines * (args.prompts // max(1, len(lines)) + 1))[:args.prompts]
    from vllm_rl.task import kit

    return kit(args.task).heldout_prompts(args.prompts)


def main(argv: list[str] | None = None) -> dict:
    args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    from tqdm import tqdm

    from vllm_rl.task import kit

    args.max_tokens = args.max_tokens or kit(args.task).max_tokens
    urls = [u.rstrip("/") for u in args.base_url]
    labels = args.labels.split(",") if args.labels else [u.split("//")[-1] for u in urls]
    if len(labels) != len(urls):
        parser().error("--labels: one name per --base-url")
    techniques = [t for t in args.techniques.split(",") if t]
    prompts = _prompts(args)
    reqs = workload(args, prompts)
    levels = [float(c) for c in args.concurrency.split(",")] if args.request_rate is None \
        else [math.inf]
    models = {u: args.model or _first_model(u) for u in urls}
    runs = []
    bar = tqdm(total=len(reqs) * len(levels) * len(urls), desc="serve-bench", unit="req",
               dynamic_ncols=True)
    for level in levels:                 # servers interleaved at each level
        for url, label in zip(urls, labels):
            bar.set_postfix_str(f"{label} concurrency {level:g}")
            samples, makespan = asyncio.run(
                run_level(url, models[url], reqs, args, level, args.request_rate, bar))
            runs.append({"label": label, "base_url": url, "model": models[url],
                         "max_concurrency": None if math.isinf(level) else int(level),
                         "request_rate": args.request_rate or "inf",
                         **metrics(samples, makespan, len(reqs), args, techniques),
                         "samples": [asdict(s) | {"text": None} for s in samples]})
    bar.close()
    result = {"args": vars(args), "techniques": techniques, "num_prompts": len(prompts),
              "samples_per_prompt": args.samples, "runs": runs}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = out / f"serve-bench-{stamp}.json"
    path.write_text(json.dumps(result, indent=1, default=str))
    pngs = [] if args.no_plots else pictures(runs, args, out, stamp)
    print_table(runs)
    print(f"\nresults: {path}" + (f"\npictures: {', '.join(map(str, pngs))}" if pngs else ""))
    return result


def _name(run: dict, many_levels: bool) -> str:
    level = "inf" if run["max_concurrency"] is None else run["max_concurrency"]
    return run["label"] + (f" c={level}" if many_levels else "")


def print_table(runs: list[dict]) -> None:
    cols = [("run", "{}"), ("makespan_s", "{:.2f}"), ("output_throughput", "{:.0f}"),
            ("request_throughput", "{:.2f}"), ("median_ttft_ms", "{:.0f}"),
            ("p99_ttft_ms", "{:.0f}"), ("mean_tpot_ms", "{:.1f}"), ("median_itl_ms", "{:.1f}"),
            ("p99_e2el_ms", "{:.0f}"), ("p90_group_completion_s", "{:.2f}"),
            ("kept_samples", "{}"), ("failed", "{}")]
    many = len({r["max_concurrency"] for r in runs}) > 1
    cells = [[c for c, _ in cols]]
    for r in runs:
        r = {**r, "run": _name(r, many)}
        cells.append([fmt.format(r[c]) if r.get(c) is not None else "" for c, fmt in cols])
    widths = [max(len(row[i]) for row in cells) for i in range(len(cols))]
    print()
    for row in cells:
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                        for i, (c, w) in enumerate(zip(row, widths))))


def pictures(runs: list[dict], args, out: Path, stamp: str) -> list[Path]:
    from vllm_rl.bench import plots

    many = len({r["max_concurrency"] for r in runs}) > 1
    lengths, running = {}, {}
    for r in runs:
        name = _name(r, many)
        ok = [s for s in r["samples"] if s["error"] is None]
        lengths[name] = [len(s["token_ids"]) for s in ok]
        events = sorted([(s["start"], 1) for s in ok] + [(s["end"], -1) for s in ok])
        xs, ys, n = [0.0], [0], 0
        for t, d in events:
            n += d
            xs.append(t)
            ys.append(n)
        running[name] = (xs, ys)
    what = (f"{args.prompts} prompts x {args.samples} samples "
            f"({'n requests' if args.group_as == 'n' else 'single requests'}), "
            f"techniques: {args.techniques or 'none'}")
    return [plots.length_cdf(lengths, out / f"serve-bench-{stamp}-lengths.png",
                             f"Generated length per sample ({what})", args.max_tokens),
            plots.running(running, out / f"serve-bench-{stamp}-running.png",
                          f"Samples in flight over the step ({what})",
                          "seconds since the step started", ylabel="samples in flight")]
