"""``vllm-rl bench duet-gate``: DUET's gate in the model's regime, against the paper's.

    vllm-rl bench duet-gate                     # 128 training prompts x 8 on the embedded model

Every prompt runs twice on the RL engine with the same per-request seeds (common random
numbers): once with no flags (every sample to its natural end) and once with DUET's gate
(the task's answer marker, K1/K2 the p30/p80 of the first run's natural lengths as App.
A.3's online estimator targets, G scaled to ``max_tokens``, eps).  A sample's DUET run is
then a prefix of its natural run (checked: ``prefix_match``), so each aborted sample's
natural outcome is known, and with it what the gate costs the estimator:

* **the regime** beside the paper's (App. A.4, Table 3): the share of samples that reach
  the gate with no marker (the paper's 1.2-6%), of which how many the model would have
  answered correctly, the length tail p99/p50, the share of correct samples within
  groups, the per-prompt length spread (DARTS's ρ = σ/L̄, Eq. 7);
* **the baseline** of Alg. A.10 l.38 (every rollout's reward, an aborted one's of its
  partial text) against the natural group mean: its mean shift, which raises the
  advantage of every sample DUET keeps in that group; beside it the inverse-propensity (Hájek)
  baseline over the samples DUET did not abort (an eps-kept one standing for 1/eps),
  which estimates the natural mean without the aborted samples' partial rewards.

Output: the table on stdout, ``duet-gate.json`` and ``duet-gate.png`` (the natural
lengths by outcome, with K1 and the gate at K2 + G) in ``--out``; vLLM's log in
``--out/vllm.log``.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from vllm_rl.regime import quantile

# The paper's figures for its regime (DUET App. A.4 / A.3, Qwen3-1.7B on MATH, 3,072 tokens)
PAPER = {"markerless_share": "1.2-6%", "k_quantiles": "p30 / p80", "grace": "150 of 3,072",
         "eps": 0.05}


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="vllm-rl bench duet-gate",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=128, help="training prompts (default 128)")
    ap.add_argument("--n", type=int, default=8, help="samples per prompt (default 8)")
    from vllm_rl.task.kits import add_argument as add_task_argument

    add_task_argument(ap)
    ap.add_argument("--max-tokens", type=int, default=None,
                    help="the response limit (default: the kit's, 256 or 1,024)")
    ap.add_argument("--eps", type=float, default=0.05, help="DUET's eps (default 0.05)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="bench-results/duet-gate")
    return ap


def baselines(rewards: list[float], natural: list[float], aborted: list[bool],
              keep_prob: list[float]) -> dict[str, float]:
    """One group's baselines: DUET's (Alg. A.10 l.38: the mean over every rollout, an
    aborted one at its partial text's reward), the natural mean (every sample run out),
    and the inverse-propensity (Hájek) mean over the samples not aborted."""
    duet = statistics.fmean(rewards)
    nat = statistics.fmean(natural)
    w = [0.0 if a else 1.0 / p for a, p in zip(aborted, keep_prob)]
    ipw = sum(wi * r for wi, r in zip(w, rewards)) / sum(w) if sum(w) > 0 else duet
    return {"duet": duet, "natural": nat, "ipw": ipw}


def analyse(prompts, natural_outs, duet_outs, reward, k1: int, gate: int) -> dict:
    """The regime and the baseline figures from the two runs (module docstring)."""
    from vllm_rl.outcome import Reason, RolloutInfo

    rows, groups = [], []
    for prompt, nat, due in zip(prompts, natural_outs, duet_outs):
        group = []
        for cn, cd in zip(nat.outputs, due.outputs):
            info = RolloutInfo.from_completion(cd)
            ids_n, ids_d = list(cn.token_ids), list(cd.token_ids)
            row = {"natural_len": len(ids_n), "natural_r": reward(prompt, cn.text),
                   "duet_len": len(ids_d), "duet_r": reward(prompt, cd.text),
                   "reason": info.reason.value,
                   "keep_prob": info.keep_prob if info.keep_prob is not None else 1.0,
                   "prefix": ids_n[:len(ids_d)] == ids_d}
            group.append(row)
        rows += group
        groups.append(group)
    aborted = [r for r in rows if r["reason"] == Reason.DUET_ABORTED.value]
    markerless = [r for r in rows if r["keep_prob"] < 1.0]
    lengths = [r["natural_len"] for r in rows]
    shift, ipw_shift = [], []
    for group in groups:
        b = baselines([r["duet_r"] for r in group], [r["natural_r"] for r in group],
                      [r["reason"] == Reason.DUET_ABORTED.value for r in group],
                      [r["keep_prob"] for r in group])
        shift.append(b["duet"] - b["natural"])
        ipw_shift.append(b["ipw"] - b["natural"])
    shares = [statistics.fmean(r["natural_r"] for r in g) for g in groups]
    spread = [statistics.pstdev([r["natural_len"] for r in g])
              / max(statistics.fmean([r["natural_len"] for r in g]), 1e-9) for g in groups]
    with_abort = [s for s, g in zip(shift, groups)
                  if any(r["reason"] == Reason.DUET_ABORTED.value for r in g)]
    return {
        "samples": len(rows), "k1": k1, "gate": gate,
        "prefix_match": statistics.fmean(r["prefix"] for r in rows),
        "markerless_share": len(markerless) / len(rows),
        "aborted_share": len(aborted) / len(rows),
        "aborted_natural_correct": (statistics.fmean(r["natural_r"] for r in aborted)
                                    if aborted else None),
        "natural_accuracy": statistics.fmean(r["natural_r"] for r in rows),
        "length_p50": quantile(lengths, 0.5), "length_p99": quantile(lengths, 0.99),
        "tail_p99_p50": quantile(lengths, 0.99) / max(quantile(lengths, 0.5), 1e-9),
        "group_correct_share_mean": statistics.fmean(shares),
        "groups_all_or_none": statistics.fmean(s in (0.0, 1.0) for s in shares),
        "length_spread_rho": statistics.fmean(spread),
        "baseline_shift_mean": statistics.fmean(shift),
        "baseline_shift_in_groups_with_abort": (statistics.fmean(with_abort)
                                                if with_abort else 0.0),
        "groups_with_abort": len(with_abort) / len(groups),
        "ipw_baseline_shift_mean": statistics.fmean(ipw_shift),
        "ipw_baseline_abs_error": statistics.fmean(abs(s) for s in ipw_shift),
        "duet_baseline_abs_error": statistics.fmean(abs(s) for s in shift),
        "rows": rows,
    }


def table(r: dict) -> str:
    def pct(x):
        return "–" if x is None else f"{100 * x:.1f}%"

    lines = ["| figure | the model here | the paper |", "|---|---|---|",
             f"| samples with no marker at the gate (K2 + G = {r['gate']}) | "
             f"{pct(r['markerless_share'])} | {PAPER['markerless_share']} |",
             f"| of which the model would have answered correctly | "
             f"{pct(r['aborted_natural_correct'])} | – |",
             f"| natural length p50 / p99 (tail p99/p50) | {r['length_p50']:.0f} / "
             f"{r['length_p99']:.0f} ({r['tail_p99_p50']:.1f}×) | – |",
             f"| correct share within groups (mean; groups all or none) | "
             f"{pct(r['group_correct_share_mean'])}; {pct(r['groups_all_or_none'])} | – |",
             f"| per-prompt length spread σ/L̄ (DARTS's ρ) | {r['length_spread_rho']:.2f} | – |",
             f"| DUET's baseline − the natural mean (all groups; groups with an abort) | "
             f"{r['baseline_shift_mean']:+.3f}; {r['baseline_shift_in_groups_with_abort']:+.3f} "
             f"| the gap vs Thm. 3 (Alg. A.10 l.38) |",
             f"| mean abs. baseline error: DUET's / inverse-propensity over the kept | "
             f"{r['duet_baseline_abs_error']:.3f} / {r['ipw_baseline_abs_error']:.3f} | – |",
             f"| DUET run a prefix of the natural run (same seeds) | "
             f"{pct(r['prefix_match'])} | – |"]
    return "\n".join(lines)


def plot(r: dict, path: Path) -> None:
    from vllm_rl.bench.plots import pyplot, save

    fig, ax = pyplot().subplots(figsize=(9, 5))
    right = [x["natural_len"] for x in r["rows"] if x["natural_r"] > 0]
    wrong = [x["natural_len"] for x in r["rows"] if x["natural_r"] <= 0]
    bins = range(0, max(x["natural_len"] for x in r["rows"]) + 8, 8)
    ax.hist([right, wrong], bins=bins, stacked=True, color=["tab:green", "tab:red"],
            label=["natural end: correct", "natural end: wrong"])
    ax.axvline(r["k1"], color="grey", ls=":", label=f"K1 = {r['k1']} (p30)")
    ax.axvline(r["gate"], color="black", ls="--",
               label=f"gate K2 + G = {r['gate']}: {100 * r['markerless_share']:.1f}% "
                     f"marker-less, {100 * (r['aborted_natural_correct'] or 0):.0f}% "
                     "of the aborted would be correct")
    ax.set_xlabel("natural length (tokens)")
    ax.set_ylabel("samples")
    ax.set_title(f"DUET's gate on the {r.get('task', 'arith')} kit: natural lengths by outcome "
                 f"({r['samples']} samples)", fontsize=10)
    ax.legend(fontsize=8)
    save(fig, path, dpi=110)


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    out = Path(args.out)
    from vllm_rl.bench.engines import in_process
    from vllm_rl.bench.logs import vllm_log_to

    in_process()
    vllm_log_to(out / "vllm.log")
    import vllm

    from vllm_rl import rl_params
    from vllm_rl.bench.engines import rl_engine
    from vllm_rl.bench.matrix import TASK_MARKER, duet_grace
    from vllm_rl.task import reward
    from vllm_rl.task.kits import kit

    task = kit(args.task)
    args.max_tokens = args.max_tokens or task.max_tokens
    prompts = task.train_prompts(args.prompts)
    llm = rl_engine(str(task.model_path), max_model_len=task.max_model_len, das=False,
                    arrol=False)

    def params(flags):
        return [vllm.SamplingParams(n=args.n, temperature=1.0, max_tokens=args.max_tokens,
                                    seed=args.seed * 100_003 + i, extra_args=flags)
                for i in range(len(prompts))]

    print(f"natural run: {len(prompts)} prompts x {args.n}")
    natural = llm.generate(prompts, params(None), use_tqdm=True)
    lengths = [len(c.token_ids) for o in natural for c in o.outputs]
    k1, k2 = round(quantile(lengths, 0.3)), round(quantile(lengths, 0.8))
    grace = duet_grace(args.max_tokens)
    flags = rl_params(duet={"pattern": TASK_MARKER, "k1": k1, "k2": k2, "grace": grace,
                            "eps": args.eps})
    print(f"DUET run: K1 {k1}, K2 {k2}, G {grace}, eps {args.eps}")
    duet = llm.generate(prompts, params(flags), use_tqdm=True)
    result = {**analyse(prompts, natural, duet, reward, k1, k2 + grace), "task": args.task}
    out.mkdir(parents=True, exist_ok=True)
    (out / "duet-gate.json").write_text(json.dumps({"args": vars(args), **result}, indent=1))
    plot(result, out / "duet-gate.png")
    print(table(result))
    print(f"results: {out / 'duet-gate.json'}, picture: {out / 'duet-gate.png'}")


if __name__ == "__main__":
    main()
