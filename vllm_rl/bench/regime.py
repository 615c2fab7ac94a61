"""``vllm-rl bench regime``: each kit's rollout regime beside the papers' (one table).

    vllm-rl bench regime                                  # both kits, about 20 min here
    vllm-rl bench regime --kits reasoning --prompts 32    # one kit, smaller
    vllm-rl bench regime --from A/regime.json --out A     # the table and picture again

Per kit (:mod:`vllm_rl.task.kits`), on the RL engine at the kit's response limit, T = 1:

1. ``--prompts`` training prompts x ``--n`` with ARRoL's hidden state at the kit's
   ``l_detect`` and DAS's trees fed (``problem_id`` per prompt): the head's training
   data, and the first step of DAS's history;
2. the same prompts again with DAS: its accepted tokens per draft token at one step of
   history;
3. ``--heldout`` held-out prompts x ``--n``: the head (trained on 1's samples as
   ``vllm-rl bench arrol`` trains it, hidden state and trace features) scores them, and
   its AUC and accuracy are read there, out of sample.

Every sample of the three runs is the model's own (DAS is lossless), so the length,
marker and group statistics (:class:`vllm_rl.regime.Regime`) read all of them.  Each row
stands beside the figure the paper gives, with its section, or says that it gives none.

Output in ``--out``: ``regime.json``, ``regime.md`` (the table and each technique's
verdict, :mod:`vllm_rl.advice`), ``regime.png`` (lengths by outcome, with DUET's gate and
the first answer), and each kit's samples as a regime log (``KIT-regime.jsonl``, what
``vllm-rl advise`` reads); vLLM's log in ``--out/vllm.log``.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

KV_BYTES = 4 << 30   # room for about 500 reasoning samples at once

# The papers' figures, quoted with their sections (None: the paper gives none).
PAPER = {
    "markerless_at_gate": "1.2-6% (DUET App. A.2.7, A.4: 'the realised marker-less rate "
                          "stabilises near 0.012-0.06'; Fig. 6(b) gives 18-30% marker "
                          "emission at the gate)",
    "tokens_after_first_answer": "none given (DUET trims within G = 150 tokens of the "
                                 "marker, Alg. A.10 l.20)",
    "length": "median 505-511, mean 665-735 of 3,072 (DUET Sec. 4.5, Qwen3-1.7B on MATH); "
              "no p90/p99 in any paper",
    "truncated": "none given (DARTS: tail pruning triggers for ~5% of prompts, Sec. 4.3.1)",
    "rho": "ρ = σ̃_L / L̃, a dataset-level moving statistic (DARTS App. B); no value given",
    "pattern_one": "Pattern I: E[l | r > 0] ≤ E[l | r < 0], no figure (DARTS Sec. 3.2.2)",
    "correct_share": "E[ρ̂] 0.40 (ARRoL) vs 0.32 (random pruning), Qwen-3-4B (ARRoL "
                     "Table 4); all-or-none share: none given",
    "head": "~80% accuracy, 82.37% on Qwen3-1.7B at L_detect = 512 of 8,192 (ARRoL Sec. "
            "5.3); no AUC given",
    "acceptance": "none given as a number (DAS Fig. 4, 6, 7 plot accepted tokens per "
                  "round); window 16-32 rollouts per problem (DAS Sec. 4.1.2)",
}


def parser() -> argparse.ArgumentParser:
    from vllm_rl.task.kits import KITS

    ap = argparse.ArgumentParser(prog="vllm-rl bench regime",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--kits", default=",".join(KITS), help="comma-separated (default: all)")
    ap.add_argument("--prompts", type=int, default=128, help="training prompts (default 128)")
    ap.add_argument("--heldout", type=int, default=32, help="held-out prompts (default 32)")
    ap.add_argument("--n", type=int, default=8, help="samples per prompt (default 8)")
    ap.add_argument("--epochs", type=int, default=60, help="the head's training epochs")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="bench-results/regime")
    ap.add_argument("--from", dest="source", default=None, metavar="REGIME_JSON",
                    help="run nothing: the table, verdicts and picture again from a "
                         "regime.json (into --out)")
    return ap


def _generate(llm, prompts, args, seed, flags_of, max_tokens):
    from vllm import SamplingParams

    params = [SamplingParams(n=args.n, temperature=1.0, max_tokens=max_tokens,
                             seed=seed + 1009 * i, extra_args=flags_of(i))
              for i in range(len(prompts))]
    return llm.generate(prompts, params, use_tqdm=False)


def measure(kit, args, progress) -> dict:
    """One kit's samples, head and regime (module docstring)."""
    import numpy as np
    import torch

    from vllm_rl import arrol as ctl
    from vllm_rl import rl_params
    from vllm_rl.bench.engines import rl_engine, shutdown
    from vllm_rl.duet.vocab import token_bytes
    from vllm_rl.regime import Regime, Sample, first_answer_tokens
    from vllm_rl.regime_log import append

    llm = rl_engine(str(kit.model_path), seed=args.seed, kv_bytes=KV_BYTES,
                    max_model_len=kit.max_model_len)
    pieces = token_bytes(llm.get_tokenizer(), llm.llm_engine.model_config.get_vocab_size())
    train, heldout = kit.train_prompts(args.prompts), kit.heldout_prompts(args.heldout)
    arrol = {"l_detect": kit.l_detect, "return_hidden": True}

    def fed(i):
        return rl_params(das={"problem_id": f"{kit.name}-{i}"}, arrol=arrol)

    runs = {}
    progress.set_postfix_str(f"{kit.name}: step 1 (head data, DAS history)")
    runs["first"] = (train, _generate(llm, train, args, args.seed, fed, kit.max_tokens))
    progress.update(1)
    progress.set_postfix_str(f"{kit.name}: step 2 (DAS at one step of history)")
    runs["again"] = (train, _generate(llm, train, args, args.seed + 500_000,
                                      lambda i: rl_params(das={"problem_id": f"{kit.name}-{i}"}),
                                      kit.max_tokens))
    progress.update(1)
    progress.set_postfix_str(f"{kit.name}: held-out samples")
    runs["heldout"] = (heldout, _generate(llm, heldout, args, args.seed + 900_000,
                                          lambda i: rl_params(arrol=arrol), kit.max_tokens))
    progress.update(1)
    hidden_size = llm.arrol_info()["hidden_size"]
    shutdown(llm)

    def head_data(run):
        prompts, outs = runs[run]
        xs, fs, ys, where = [], [], [], []
        for i, (prompt, out) in enumerate(zip(prompts, outs)):
            for j, c in enumerate(out.outputs):
                info = c.rollout_info
                if info.hidden is not None:
                    xs.append(info.hidden_state())
                    fs.append(info.trace)
                    ys.append(kit.reward(prompt, c.text))
                    where.append((i, j))
        return (torch.from_numpy(np.stack(xs)), torch.tensor(fs, dtype=torch.float32),
                torch.tensor(ys), where)

    torch.manual_seed(args.seed)
    head = ctl.QualityHead(hidden_size, inputs="both")
    xs, fs, ys, _ = head_data("first")
    ctl.HeadTrainer(head, lr=3e-3, weight_decay=1e-2).fit(xs, ys, epochs=args.epochs,
                                                          batch_size=256, features=fs)
    xh, fh, _, where = head_data("heldout")
    scores = dict(zip(where, head.score(xh, fh).tolist()))

    samples, rows = [], []
    for run, (prompts, outs) in runs.items():
        for i, (prompt, out) in enumerate(zip(prompts, outs)):
            for j, c in enumerate(out.outputs):
                info = c.rollout_info
                ids = list(c.token_ids)
                drafted = run == "again"
                s = Sample(group=f"{run}-{i}", length=len(ids),
                           truncated=c.finish_reason == "length",
                           first_answer=first_answer_tokens([pieces[t] for t in ids]),
                           reward=kit.reward(prompt, c.text),
                           score=scores.get((i, j)) if run == "heldout" else None,
                           draft_proposed=info.draft_proposed if drafted else None,
                           draft_accepted=info.draft_accepted if drafted else None)
                samples.append(s)
                rows.append([s.length, s.truncated, s.first_answer, s.reward])
    regime = Regime.of(samples, kit.max_tokens)
    log = Path(args.out) / f"{kit.name}-regime.jsonl"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.unlink(missing_ok=True)
    append(log, 0, samples, kit.max_tokens)
    return {"kit": kit.name, "model": str(kit.model_path), "max_tokens": kit.max_tokens,
            "l_detect": kit.l_detect, "regime": regime.as_dict(), "rows": rows}


def table(results: list[dict]) -> str:
    """The regime table: one column per kit, the papers' figure beside each row."""
    def pct(x):
        return "–" if x is None else f"{100 * x:.1f}%"

    def num(x, fmt=".2f"):
        return "–" if x is None else format(x, fmt)

    rows = [
        ("samples with no marker at DUET's gate K2 + G (the gate)",
         lambda r: f"{pct(r['markerless_at_gate'])} ({r['gate']})", "markerless_at_gate"),
        ("tokens after the first answer: mean per sample; share of all tokens",
         lambda r: f"{num(r['tokens_after_first_answer'], '.0f')}; "
                   f"{pct(r['share_after_first_answer'])}", "tokens_after_first_answer"),
        ("length p50 / p90 / p99 (response limit)",
         lambda r: f"{r['length_p50']:.0f} / {r['length_p90']:.0f} / {r['length_p99']:.0f} "
                   f"({r['max_tokens']})", "length"),
        ("share cut by the limit", lambda r: pct(r["truncated"]), "truncated"),
        ("DARTS's ρ = σ̃_L / L̃ (all lengths); per-prompt σ/L̄",
         lambda r: f"{r['rho']:.2f}; {r['rho_per_prompt']:.2f}", "rho"),
        ("wrong / right mean length within a group (Pattern I above 1)",
         lambda r: num(r["wrong_over_right_length"]), "pattern_one"),
        ("correct share within groups; groups all right or all wrong",
         lambda r: f"{pct(r['correct_share'])}; {pct(r['all_or_none'])}", "correct_share"),
        ("ARRoL's head at l_detect, held out: AUC pooled / within groups; accuracy",
         lambda r: f"{num(r['head_auc'])} / {num(r['head_auc_within'])}; "
                   f"{pct(r['head_accuracy'])} ({r['scored']} scored)", "head"),
        ("DAS: accepted tokens per draft token, one step of history",
         lambda r: f"{num(r['draft_acceptance'])} ({r['draft_tokens']:,} drafted)",
         "acceptance"),
    ]
    head = "| statistic | " + " | ".join(
        f"{x['kit']} (l_detect {x['l_detect']})" for x in results) + " | the papers |"
    lines = [head, "|" + "---|" * (len(results) + 2)]
    for name, cell, paper in rows:
        lines.append(f"| {name} | " + " | ".join(cell(x["regime"]) for x in results)
                     + f" | {PAPER[paper]} |")
    return "\n".join(lines)


def verdict_table(results: list[dict]) -> str:
    from vllm_rl.advice import verdicts
    from vllm_rl.regime import Regime

    lines = ["| kit | technique | its gate | why | rests on |", "|---|---|---|---|---|"]
    for x in results:
        for v in verdicts(Regime(**x["regime"])):
            lines.append(f"| {x['kit']} | {v.technique} | {v.decision} | {v.why} | "
                         f"{v.rests_on} |")
    return "\n".join(lines)


def plot(results: list[dict], path: Path) -> None:
    from vllm_rl.bench.plots import pyplot, save

    fig, axes = pyplot().subplots(len(results), 1, figsize=(10, 3.6 * len(results)), squeeze=False)
    for ax, x in zip(axes[:, 0], results):
        r, rows = x["regime"], x["rows"]
        bins = range(0, x["max_tokens"] + 16, max(4, x["max_tokens"] // 64))
        ax.hist([[n for n, _, _, w in rows if w > 0], [n for n, _, _, w in rows if w <= 0]],
                bins=bins, stacked=True, color=["tab:green", "tab:red"],
                label=["length, correct", "length, wrong"])
        ax.hist([f for _, _, f, _ in rows if f is not None], bins=bins, histtype="step",
                color="black", label="tokens to the first answer")
        ax.axvline(r["gate"], color="black", ls="--",
                   label=f"DUET's gate K2 + G = {r['gate']}: "
                         f"{100 * r['markerless_at_gate']:.1f}% marker-less")
        ax.set_title(f"kit {x['kit']}: {r['samples']} samples, limit {x['max_tokens']}, "
                     f"{100 * r['truncated']:.1f}% cut by it", fontsize=10)
        ax.set_xlabel("tokens")
        ax.set_ylabel("samples")
        ax.legend(fontsize=8)
    save(fig, path, dpi=110)


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    out = Path(args.out)
    from tqdm import tqdm

    from vllm_rl.bench.engines import in_process
    from vllm_rl.bench.logs import vllm_log_to
    from vllm_rl.task.kits import kit

    out.mkdir(parents=True, exist_ok=True)
    if args.source:
        results = json.loads(Path(args.source).read_text())["kits"]
    else:
        kits = [kit(name) for name in args.kits.split(",")]
        in_process()
        vllm_log_to(out / "vllm.log")
        t0 = time.time()
        results = []
        with tqdm(total=3 * len(kits), desc="regime runs", unit="run") as progress:
            for k in kits:
                results.append(measure(k, args, progress))
        (out / "regime.json").write_text(json.dumps(
            {"args": vars(args), "minutes": (time.time() - t0) / 60, "kits": results},
            indent=1))
    text = table(results) + "\n\n" + verdict_table(results) + "\n"
    (out / "regime.md").write_text(text)
    plot(results, out / "regime.png")
    print(text)
    print(f"results: {out / 'regime.json'}, {out / 'regime.md'}, picture: {out / 'regime.png'}")


if __name__ == "__main__":
    main()
