"""ARRoL on the embedded model: the quality head's signal at l_detect, then one rollout step.

    vllm-rl bench arrol                              # the l_detect sweep, then one step
    vllm-rl bench arrol --l-detect 32                # skip the sweep

1. **Head quality** (the paper's Fig. 2c on this model).  For each candidate ``l_detect``
   the engine generates the training prompts (``--train-prompts`` × ``--n``) and the
   held-out prompts with ``arrol.return_hidden``: every sample past ``l_detect`` comes
   back with the final-norm hidden state of its ``l_detect``-th token, taken by the
   engine in the step that computed it.  The head (2-layer MLP, 128 hidden; Sec. 4.2) is
   trained on the training samples' hidden states against their final reward
   (cross-entropy, ``vllm_rl.arrol.HeadTrainer``) and scored on the held-out ones:
   Spearman correlation and AUC against correctness, beside the trace-confidence
   baseline (mean token negative log-probability up to ``l_detect``, sign flipped so that
   higher means more confident).  Beyond the paper, the same training samples fit two
   more heads on the trace features the engine returns at ``l_detect`` (mean and minimum
   token log-probability, mean entropy): ``trace`` (features only) and ``both`` (hidden
   state and features): their held-out AUC is ``trace_head_auc`` / ``both_head_auc``.  ``l_detect`` is the shortest candidate whose held-out
   AUC is within 0.02 of the best one: the paper's rule (Fig. 2d: detection early,
   where the signal has plateaued) on this model's lengths.
2. **One rollout step.**  The trained head and a calibration from the training
   samples (``vllm_rl.arrol.CalibrationBuffer``: Eq. 1 counts, δ by bisection so that
   E[p] = κ) are pushed into the running engine with ``arrol_update``; the held-out
   prompts are generated with ``n = --group`` and the ``arrol`` flags, and with stock
   vLLM (same seeds, same process).  Reported: per group, the positive share of the kept
   samples against ρ and E[ρ̂(1 − ρ̂)] (the paper's Table 4 quantities), the kept share
   against κ, tokens, engine steps, CPU wall, and the projected H100 time of the same
   steps (``vllm_rl.cost``; a projection): the forward passes only, and with the host
   time measured here on each step's critical path counted (scheduling, output
   processing, ARRoL's scorer, times ``--host-scale``; both engines schedule
   asynchronously, so the core's part overlaps the forward pass and the scorer's does
   not: :func:`vllm_rl.cost.host.host_counted`).

Output: tables on stdout, JSON and a PNG under ``bench-results/``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path


SWEEP = (8, 16, 24, 32, 48, 64)


def collect(llm, prompts, n, max_tokens, l_detect, seed):
    """(hidden [N, H], labels, trace confidences, lengths) of the samples scored at
    ``l_detect``, plus every sample's (prompt index, reward, length)."""
    import numpy as np
    from vllm import SamplingParams

    from vllm_rl import rl_params
    from vllm_rl.task import reward

    params = [SamplingParams(n=n, temperature=1.0, max_tokens=max_tokens, seed=seed + i,
                             logprobs=0, extra_args=rl_params(
                                 arrol={"l_detect": l_detect, "return_hidden": True}))
              for i in range(len(prompts))]
    outs = llm.generate(prompts, params, use_tqdm=False)
    hidden, labels, conf, trace = [], [], [], []
    for prompt, out in zip(prompts, outs):
        for c in out.outputs:
            info = c.rollout_info
            if info.hidden is None:
                continue
            hidden.append(info.hidden_state())
            labels.append(reward(prompt, c.text))
            lps = [next(iter(d.values())).logprob for d in c.logprobs[:l_detect]]
            conf.append(-float(np.mean([-x for x in lps])))
            trace.append(info.trace)
    return (np.stack(hidden) if hidden else np.zeros((0, 1), "float32"),
            np.asarray(labels, "float32"), np.asarray(conf, "float64"),
            np.asarray(trace, "float32").reshape(-1, 3))


def head_quality(llm, args, train, heldout, hidden_size, l_detect):
    import torch

    from vllm_rl import arrol as ctl

    xs, ys, _, fs = collect(llm, train, args.n, args.max_tokens, l_detect, args.seed)
    xh, yh, ch, fh = collect(llm, heldout, args.n, args.max_tokens, l_detect,
                             args.seed + 10_000)
    heads, aucs = {}, {}
    for inputs in ("hidden", "trace", "both"):
        torch.manual_seed(args.seed)
        head = ctl.QualityHead(hidden_size, inputs=inputs)
        feats = (torch.from_numpy(fs), torch.from_numpy(fh)) if inputs != "hidden" else (None, None)
        ctl.HeadTrainer(head, lr=args.lr, weight_decay=args.weight_decay).fit(
            torch.from_numpy(xs), torch.from_numpy(ys), epochs=args.epochs, batch_size=256,
            features=feats[0])
        s_held = head.score(torch.from_numpy(xh), feats[1]).numpy()
        heads[inputs] = (head, head.score(torch.from_numpy(xs), feats[0]).numpy())
        aucs[inputs] = (ctl.spearman(s_held, yh), ctl.auc(s_held, yh))
    head, s_train = heads[args.head_inputs]
    return {
        "l_detect": l_detect, "train_scored": int(len(ys)), "heldout_scored": int(len(yh)),
        "heldout_positive": float(yh.mean()) if len(yh) else 0.0,
        "head_spearman": aucs["hidden"][0], "head_auc": aucs["hidden"][1],
        "trace_head_auc": aucs["trace"][1], "both_head_auc": aucs["both"][1],
        "conf_spearman": ctl.spearman(ch, yh), "conf_auc": ctl.auc(ch, yh),
        "chosen_auc": aucs[args.head_inputs][1],
    }, head, (s_train, ys)


def rollout_step(llm, stock, prompts, args, l_detect, costs, host_scale: float = 1.0):
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    from vllm_rl import Reason, rl_params
    from vllm_rl.engine.trace import engine_trace
    from vllm_rl.llm import attach_rollout_info
    from vllm_rl.task import reward

    out = {}
    for name, engine in (("stock", stock), ("arrol", llm)):
        trace = engine_trace(engine)
        mark = trace.mark()
        params = [SamplingParams(
            n=args.group, temperature=1.0, max_tokens=args.max_tokens, seed=args.seed + 7 * i,
            output_kind=RequestOutputKind.FINAL_ONLY,
            extra_args=rl_params(arrol={"l_detect": l_detect, "kappa": args.kappa,
                                        "rho": args.rho}) if name == "arrol" else None)
            for i in range(len(prompts))]
        t0 = time.perf_counter()
        outs = engine.generate(prompts, params, use_tqdm=False)
        wall = time.perf_counter() - t0
        if name == "stock":
            attach_rollout_info(outs, params)
        steps = trace.since(mark)
        shares, kept, tokens, pruned = [], 0, 0, 0
        for prompt, o in zip(prompts, outs):
            rewards = []
            for c in o.outputs:
                tokens += len(c.token_ids)
                if c.rollout_info.reason is Reason.ARROL_PRUNED:
                    pruned += 1
                    continue
                rewards.append(reward(prompt, c.text))
            kept += len(rewards)
            if rewards:
                shares.append(statistics.fmean(rewards))
        out[name] = {
            "wall_s": wall, "engine_steps": len(steps), "tokens": tokens,
            "samples": args.group * len(prompts), "kept": kept, "pruned": pruned,
            "kept_share": kept / (args.group * len(prompts)),
            "positive_share_mean": statistics.fmean(shares),
            "abs_dev_from_rho": statistics.fmean(abs(s - args.rho) for s in shares),
            "rho_var": statistics.fmean(s * (1 - s) for s in shares),
            "degenerate_groups": sum(s in (0.0, 1.0) for s in shares),
            "shares": shares,
        }
        for k, c in costs.items():
            proj = steps.project(c, host_scale=host_scale)
            out[name][f"projected_ms_{k}"] = proj.total_ms
            out[name][f"host_counted_ms_{k}"] = proj.host_counted_ms
            out[name]["host_core_ms"] = proj.host_core_ms
            out[name]["host_worker_ms"] = proj.host_worker_ms
            out[name]["asynchronous"] = proj.asynchronous
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="vllm-rl bench arrol", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--train-prompts", type=int, default=192)
    ap.add_argument("--heldout", type=int, default=64)
    ap.add_argument("--n", type=int, default=8, help="samples per prompt for head data")
    ap.add_argument("--group", type=int, default=16, help="samples per prompt in the step")
    from vllm_rl.task.kits import add_argument as add_task_argument

    add_task_argument(ap)
    ap.add_argument("--max-tokens", type=int, default=None,
                    help="the response limit (default: the kit's, 256 or 1,024)")
    ap.add_argument("--l-detect", type=int, default=None, help="skip the sweep")
    ap.add_argument("--kappa", type=float, default=0.5)
    ap.add_argument("--rho", type=float, default=0.5)
    ap.add_argument("--epochs", type=int, default=60)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--weight-decay", type=float, default=1e-2)
    ap.add_argument("--head-inputs", default="both", choices=("hidden", "trace", "both"),
                    help="the head the rollout step uses (default both)")
    ap.add_argument("--host-scale", type=float, default=1.0,
                    help="multiplies the host times measured here in the host-counted "
                         "projection: 0.5 models a host CPU twice as fast (default 1.0)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="bench-results")
    args = ap.parse_args(argv)
    from vllm_rl.bench.logs import vllm_log_to

    vllm_log_to(Path(args.out) / "vllm.log")        # vLLM's log lines to a file
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

    import vllm
    from tqdm import tqdm

    from vllm_rl import LLM
    from vllm_rl import arrol as ctl
    from vllm_rl.cost import load_cost
    from vllm_rl.engine.trace import TRACED_SCHEDULER_CLS
    from vllm_rl.task.kits import kit

    task = kit(args.task)
    args.max_tokens = args.max_tokens or task.max_tokens
    model = args.model or str(task.model_path)
    common = dict(seed=args.seed, max_model_len=max(1024, task.max_model_len),
                  kv_cache_memory_bytes=2 << 30,
                  use_tqdm_on_load=False)
    llm = LLM(model, arrol=True, trace=True, **common)
    stock = vllm.LLM(model, scheduler_cls=TRACED_SCHEDULER_CLS, async_scheduling=True,
                     additional_config={"vllm_rl_trace": True}, **common)
    hidden_size = llm.arrol_info()["hidden_size"]
    train, heldout = task.train_prompts(args.train_prompts), task.heldout_prompts(args.heldout)

    sweep = [args.l_detect] if args.l_detect else list(SWEEP)
    rows, heads = [], {}
    for l_detect in tqdm(sweep, desc="l_detect sweep", unit="length"):
        row, head, buf = head_quality(llm, args, train, heldout, hidden_size, l_detect)
        rows.append(row)
        heads[l_detect] = (head, buf)
    best = max(r["chosen_auc"] for r in rows)
    chosen = min(r["l_detect"] for r in rows if r["chosen_auc"] >= best - 0.02)
    print(f"\nmodel {model}; head trained on {args.train_prompts} training prompts x "
          f"{args.n}, evaluated on {args.heldout} held-out prompts x {args.n}; samples "
          "scored only if they run past l_detect")
    _table(rows, ["l_detect", "train_scored", "heldout_scored", "heldout_positive",
                  "head_spearman", "head_auc", "trace_head_auc", "both_head_auc",
                  "conf_spearman", "conf_auc"])
    print(f"l_detect = {chosen}: the shortest within 0.02 AUC of the best ({best:.3f})")

    head, (s_train, y_train) = heads[chosen]
    buffer = ctl.CalibrationBuffer()
    buffer.add(s_train.tolist(), y_train.tolist())
    cal = buffer.calibration(kappa=args.kappa, rho=args.rho)
    version = llm.arrol_update(head=head.export(1), calibration=cal)
    costs = {s: load_cost(f"h100:{s}") for s in ("qwen3-8b", "qwen3-1.7b")}
    step = rollout_step(llm, stock, heldout, args, chosen, costs, args.host_scale)
    print(f"\none rollout step: {args.heldout} held-out prompts x {args.group}, "
          f"l_detect {chosen}, kappa {args.kappa}, rho {args.rho}, head version {version}, "
          f"calibration delta {cal.delta:.4f} prior {cal.prior:.3f}; projected H100 ms are "
          "a PROJECTION of the same engine steps on the step-cost table (forward passes "
          "only); host_counted_ms adds the host time MEASURED on this CPU "
          f"(x {args.host_scale:g}; async engines: the core's part under max, the "
          "scorer's added)")
    keys = ["wall_s", "engine_steps", "tokens", "kept", "kept_share", "positive_share_mean",
            "abs_dev_from_rho", "rho_var", "degenerate_groups", "host_core_ms",
            "host_worker_ms", "projected_ms_qwen3-8b", "host_counted_ms_qwen3-8b",
            "projected_ms_qwen3-1.7b", "host_counted_ms_qwen3-1.7b"]
    _table([{"engine": k, **{kk: v[kk] for kk in keys}} for k, v in step.items()],
           ["engine", *keys])
    s, a = step["stock"], step["arrol"]
    print(f"arrol vs stock: tokens {s['tokens'] / a['tokens']:.3f}x fewer, CPU wall "
          f"{s['wall_s'] / a['wall_s']:.3f}x, projected 8B GPU-only "
          f"{s['projected_ms_qwen3-8b'] / a['projected_ms_qwen3-8b']:.3f}x, with host "
          f"{s['host_counted_ms_qwen3-8b'] / a['host_counted_ms_qwen3-8b']:.3f}x")

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = out / f"arrol-{stamp}.json"
    path.write_text(json.dumps({"args": vars(args), "model": model, "sweep": rows,
                                "l_detect": chosen, "calibration": cal.to_dict(),
                                "step": step}, indent=1))
    png = out / f"arrol-{stamp}.png"
    _plot(rows, chosen, step, args.rho, png)
    print(f"\nwrote {path}\nwrote {png}")
    for e in (llm, stock):
        e.llm_engine.engine_core.shutdown()


def _table(rows, keys):
    cells = [keys] + [[(f"{r[k]:.3f}" if isinstance(r[k], float) else str(r[k])) for k in keys]
                      for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(keys))]
    for c in cells:
        print("  ".join(x.rjust(w) for x, w in zip(c, widths)))


def _plot(rows, chosen, step, rho, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.5))
    ls = [r["l_detect"] for r in rows]
    a1.plot(ls, [r["head_auc"] for r in rows], "o-", label="head AUC (hidden state)")
    a1.plot(ls, [r["trace_head_auc"] for r in rows], "^-", label="head AUC (trace features)")
    a1.plot(ls, [r["both_head_auc"] for r in rows], "v-", label="head AUC (both)")
    a1.plot(ls, [r["head_spearman"] for r in rows], "o--", label="quality head Spearman")
    a1.plot(ls, [r["conf_auc"] for r in rows], "s-", label="trace confidence AUC")
    a1.plot(ls, [r["conf_spearman"] for r in rows], "s--", label="trace confidence Spearman")
    a1.axvline(chosen, color="k", lw=0.8, ls=":")
    a1.set_xlabel("l_detect (generated tokens)")
    a1.set_ylabel("against correctness (held-out)")
    a1.set_title("signal at l_detect (cf. the paper's Fig. 2c)")
    a1.legend(fontsize=8)
    bins = [i / 8 for i in range(9)]
    a2.hist([step["stock"]["shares"], step["arrol"]["shares"]], bins=bins,
            label=["stock: all samples", "ARRoL: kept samples"])
    a2.axvline(rho, color="k", lw=0.8, ls=":")
    a2.set_xlabel("positive share per group")
    a2.set_ylabel("groups")
    a2.set_title("one rollout step")
    a2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)

