"""``vllm-rl bench arrol-gate``: the within-group AUC from which ARRoL's steering helps.

    vllm-rl bench arrol-gate                    # 64 prompts x 16 on the embedded model

ARRoL prunes each group toward a share ρ of correct samples (Eq. 2).  A head that ranks
too poorly *within* a group (the ranking Eq. 2 uses: :func:`vllm_rl.arrol.grouped_auc`)
leaves the kept groups farther from ρ than keeping every sample, as stock vLLM does.
This measures where that turns, on the embedded model's own groups (on that model: at no
AUC, so the trainer's gate tests the same balance on the user's own recent groups,
:func:`vllm_rl.arrol.measures.balance_gain`, with :data:`vllm_rl.arrol.controller.AUC_GATE`
only a floor):

1. **Groups.**  ``--prompts`` held-out prompts × ``--n`` samples (temperature 1,
   ``--max-tokens``) on the embedded model, each sample's reward
   (:func:`vllm_rl.task.reward`): the model's real spread of per-prompt correct shares.
2. **Heads of a known within-group AUC.**  For each AUC a on the grid, each sample gets
   a score s = sigmoid(d·y + z), z ~ N(0, 1), d = √2 Φ⁻¹(a) (binormal: a positive
   outranks a negative of its group with probability a).  The calibration
   (:class:`~vllm_rl.arrol.calibration.CalibrationBuffer`: Eq. 1's counts, π, δ) is
   fitted on an independent draw of scores (out of sample, as the engine's is), then
   each sample's p (App. A.4, Eq. 2) and ``--draws`` draws of the coins (Alg. 1 l.19).
3. **Balance.**  Per group and draw, the kept share ρ̂ of correct samples; the measure
   is E|ρ̂ − ρ| over groups and draws (a group with no sample kept counts |0 − ρ|),
   beside stock's E|ρ̂ − ρ| over the same groups, every sample kept.  The paper's
   Table 4 quantity E[ρ̂(1 − ρ̂)] is reported beside it.
4. **The gate**: the smallest grid AUC from which on ARRoL's E|ρ̂ − ρ| stays below
   stock's, with the upper end of a 95% bootstrap interval over groups below it too.

Output: the table on stdout, ``arrol-gate.json`` and ``arrol-gate.png`` (E|ρ̂ − ρ|
against the within-group AUC, stock as a line) under ``--out``; vLLM's log to a file.
"""
from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path
from statistics import NormalDist

import numpy as np

GRID = (0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95)


def binormal_scores(labels: np.ndarray, auc: float, rng: np.random.Generator) -> np.ndarray:
    """Scores in (0, 1) whose positive outranks a negative with probability ``auc``:
    sigmoid(d·y + z), z ~ N(0, 1), d = √2 Φ⁻¹(auc)."""
    d = math.sqrt(2.0) * NormalDist().inv_cdf(min(max(auc, 1e-9), 1 - 1e-9))
    return 1.0 / (1.0 + np.exp(-(d * labels + rng.standard_normal(labels.shape))))


def balance(groups: list[np.ndarray], auc: float, *, kappa: float = 0.5, rho: float = 0.5,
            lam: float = 0.5, p_min: float = 0.1, p_max: float = 0.9, draws: int = 200,
            boot: int = 1000, seed: int = 0) -> dict:
    """ARRoL's and stock's balance at within-group AUC ``auc`` over ``groups`` (each a 0/1
    array of one prompt's rewards); see the module docstring, steps 2-4."""
    from vllm_rl.arrol.calibration import CalibrationBuffer
    from vllm_rl.arrol.measures import grouped_auc
    from vllm_rl.arrol.rule import posterior, survival

    rng = np.random.default_rng(seed)
    y = np.concatenate(groups).astype(np.float64)
    gid = np.concatenate([np.full(len(g), i) for i, g in enumerate(groups)])
    buf = CalibrationBuffer(window=max(len(y), 1))
    buf.add(binormal_scores(y, auc, rng).tolist(), y.astype(int).tolist())
    cal = buf.calibration(kappa=kappa, rho=rho, lam=lam, p_min=p_min, p_max=p_max)
    s = binormal_scores(y, auc, rng)
    p = np.array([survival(posterior(cal, v), cal.delta, kappa, rho, lam, p_min, p_max)
                  for v in s])
    kept = rng.uniform(size=(draws, len(y))) < p                       # Alg. 1 l.19
    n_groups = len(groups)
    k_pos = np.zeros((draws, n_groups))
    k_all = np.zeros((draws, n_groups))
    np.add.at(k_pos.T, gid, (kept * y).T)
    np.add.at(k_all.T, gid, kept.T)
    share = np.divide(k_pos, k_all, out=np.zeros_like(k_pos), where=k_all > 0)
    dist = np.abs(share - rho).mean(axis=0)                            # per group
    stock = np.array([abs(g.mean() - rho) for g in groups])
    # random pruning at the same keep rate: the paper's Table 4 baseline
    rand = rng.uniform(size=(draws, len(y))) < kept.mean()
    r_pos = np.zeros((draws, n_groups))
    r_all = np.zeros((draws, n_groups))
    np.add.at(r_pos.T, gid, (rand * y).T)
    np.add.at(r_all.T, gid, rand.T)
    r_share = np.divide(r_pos, r_all, out=np.zeros_like(r_pos), where=r_all > 0)
    r_dist = np.abs(r_share - rho).mean(axis=0)
    gain, r_gain = stock - dist, r_dist - dist
    idx = rng.integers(0, n_groups, size=(boot, n_groups))
    lo, hi = np.quantile(gain[idx].mean(axis=1), [0.025, 0.975])
    r_lo, r_hi = np.quantile(r_gain[idx].mean(axis=1), [0.025, 0.975])
    return {"auc": auc, "within_group_auc": grouped_auc(s, y.astype(int), np.ones_like(y), gid),
            "arrol_distance": float(dist.mean()), "stock_distance": float(stock.mean()),
            "random_distance": float(r_dist.mean()),
            "gain": float(gain.mean()), "gain_lo": float(lo), "gain_hi": float(hi),
            "gain_vs_random": float(r_gain.mean()), "gain_vs_random_lo": float(r_lo),
            "gain_vs_random_hi": float(r_hi),
            "arrol_var": float((share * (1 - share)).mean()),
            "random_var": float((r_share * (1 - r_share)).mean()),
            "stock_var": float(np.mean([g.mean() * (1 - g.mean()) for g in groups])),
            "kept_share": float(kept.mean()), "kappa": kappa}


def gate(rows: list[dict], key: str = "gain_lo") -> float | None:
    """The smallest grid AUC from which on every row's gain interval (``key``: its low
    end; ``"gain_lo"`` against stock, ``"gain_vs_random_lo"`` against random pruning) is
    above 0; None when the best AUC's is not."""
    best = None
    for row in sorted(rows, key=lambda r: -r["auc"]):
        if row[key] <= 0:
            break
        best = row["auc"]
    return best


def plot(rows: list[dict], threshold: float | None, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = [r["auc"] for r in rows]
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    ax.plot(x, [r["arrol_distance"] for r in rows], "o-", label="ARRoL (Eq. 2, coins drawn)")
    ax.fill_between(x, [r["stock_distance"] - r["gain_lo"] for r in rows],
                    [r["stock_distance"] - r["gain_hi"] for r in rows], alpha=0.2,
                    label="95% interval (bootstrap over groups)")
    ax.axhline(rows[0]["stock_distance"], color="k", ls="--", label="stock (every sample kept)")
    ax.plot(x, [r["random_distance"] for r in rows], "s:", color="grey", ms=4,
            label="random pruning at the same keep rate (the paper's Table 4 baseline)")
    if threshold is not None:
        ax.axvline(threshold, color="tab:red", ls=":", label=f"gate = {threshold:.2f}")
    ax.set_xlabel("within-group AUC of the head")
    ax.set_ylabel("E|ρ̂ − ρ| of the kept groups")
    ax.set_title("Where ARRoL's steering beats keeping everything")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="vllm-rl bench arrol-gate",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--prompts", type=int, default=64, help="held-out prompts (groups)")
    ap.add_argument("--n", type=int, default=16, help="samples per prompt")
    ap.add_argument("--max-tokens", type=int, default=None,
                    help="(default: the kit's limit, 256 or 1,024)")
    from vllm_rl.task.kits import add_argument as add_task_argument

    add_task_argument(ap)
    ap.add_argument("--kappa", type=float, default=0.5)
    ap.add_argument("--rho", type=float, default=0.5)
    ap.add_argument("--draws", type=int, default=200, help="coin draws per AUC")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="bench-results")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from vllm_rl.bench.logs import vllm_log_to

    vllm_log_to(out / "vllm.log")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from tqdm import tqdm
    from vllm import LLM, SamplingParams

    from vllm_rl.task import kit, reward

    task = kit(args.task)
    args.max_tokens = args.max_tokens or task.max_tokens
    model = args.model or str(task.model_path)
    prompts = task.heldout_prompts(args.prompts)
    print(f"rollouts: {args.prompts} held-out prompts x {args.n}, max_tokens "
          f"{args.max_tokens}, on {model} (stock vLLM: no flags needed)", flush=True)
    llm = LLM(model, seed=args.seed, max_model_len=max(1024, task.max_model_len),
              kv_cache_memory_bytes=2 << 30,
              use_tqdm_on_load=False)
    outs = llm.generate(prompts, [SamplingParams(n=args.n, temperature=1.0,
                                                 max_tokens=args.max_tokens,
                                                 seed=args.seed + i)
                                  for i in range(len(prompts))], use_tqdm=True)
    groups = [np.array([reward(p, c.text) > 0 for c in o.outputs], dtype=np.float64)
              for p, o in zip(prompts, outs)]
    rows = [balance(groups, a, kappa=args.kappa, rho=args.rho, draws=args.draws,
                    seed=args.seed + k)
            for k, a in enumerate(tqdm(GRID, desc="AUC grid", unit="auc"))]
    threshold = gate(rows)
    print(f"\nper-prompt correct share: mean {np.mean([g.mean() for g in groups]):.3f}, "
          f"groups all-correct {sum(g.all() for g in groups)}, all-wrong "
          f"{sum(not g.any() for g in groups)} of {len(groups)}; κ = {args.kappa}, "
          f"ρ = {args.rho}, λ = 0.5, p in [0.1, 0.9]\n")
    print("| within-group AUC | realised | E|ρ̂−ρ| ARRoL | stock | gain (95% CI) | "
          "E[ρ̂(1−ρ̂)] ARRoL | stock | kept |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        realised = ("–" if r["within_group_auc"] is None else   # no group mixes outcomes
                    f"{r['within_group_auc']:.3f}")
        print(f"| {r['auc']:.2f} | {realised} | {r['arrol_distance']:.4f} | "
              f"{r['stock_distance']:.4f} | {r['gain']:+.4f} ({r['gain_lo']:+.4f} to "
              f"{r['gain_hi']:+.4f}) | {r['arrol_var']:.4f} | {r['stock_var']:.4f} | "
              f"{r['kept_share']:.3f} |")
    print(f"\ngate: {threshold if threshold is not None else 'none on the grid'} (the "
          "smallest AUC from which on ARRoL's balance beats stock's, 95% interval)")
    result = {"args": vars(args), "model": model, "rows": rows, "gate": threshold,
              "shares": [float(g.mean()) for g in groups]}
    (out / "arrol-gate.json").write_text(json.dumps(result, indent=1))
    plot(rows, threshold, out / "arrol-gate.png")
    print(f"results: {out / 'arrol-gate.json'}, picture: {out / 'arrol-gate.png'}, "
          f"vLLM's log: {out / 'vllm.log'}")
    return result


if __name__ == "__main__":
    main()
