"""A real GRPO loop on the CPU: TRL's GRPOTrainer trains the embedded model through the engine.

    python benchmarks/grpo_demo.py                      # stock, darts, duet, das, arrol, all
    python benchmarks/grpo_demo.py --configs stock,all --steps 10

Each configuration starts from the same embedded model with the same seeds and runs the
same number of GRPO steps (``num_generations`` = M samples per prompt enter the loss).
Rollouts come from an engine in this process through TRL's ``rollout_func``
(:class:`vllm_rl.integrations.trl.RolloutFunc`): every step the trainer's new weights are
loaded into the engine (vLLM's ``reload_weights``), and each technique's records go into
the loss (:mod:`vllm_rl.integrations.trl.rollout`): DARTS returns its M selected of M′,
DUET-aborted and ARRoL-pruned samples are masked and leave the group baseline, DUET's
ε-kept ones carry 1/ε on their advantage (:class:`~vllm_rl.integrations.trl.trainer.RLGRPOTrainer`).
Between steps the trainer side runs as the papers do: DUET's K1/K2 from the last step's
kept lengths (p30 / p80, App. A.3), ARRoL's head and calibration trained on the returned
hidden states and rewards (:class:`vllm_rl.integrations.verl.feedback.ArrolFeedback`,
3 cold-start steps), DAS trees kept across steps (problem id = the prompt).

``stock`` is stock vLLM (its own scheduler, same weights reload); the technique runs share
one vllm_rl engine with the DAS drafter and ARRoL head (synchronous scheduling, as DAS
needs; a request without a ``das`` section gets no drafts).  Engines run in-process with
the step trace, so each step is also priced on the H100 cost table
(``h100:qwen3-8b``, a projection).  Per step: mean reward of the training group,
held-out accuracy (sampled at T = 1, every ``--eval-every`` steps), mean response length, rollout
wall time and projected H100 time; PNG and JSON in ``--out``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for _p in (ROOT, ROOT / "benchmarks"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

CONFIGS = ("stock", "darts", "duet", "das", "arrol", "all")
TASK_MARKER = r"\\boxed\{[^}]*\}"        # the embedded task's answer marker (rollout.py)


def technique_flags(name: str, m: int, max_tokens: int) -> tuple[dict | None, int]:
    """(flags, M′) of a configuration."""
    darts = {"darts": {"mode": "shortest"}}
    duet = {"duet": {"pattern": TASK_MARKER, "k1": int(0.3 * max_tokens),
                     "k2": int(0.7 * max_tokens), "grace": 16, "eps": 0.2}}
    das = {"das": {}}
    arrol = {"arrol": {"l_detect": 32, "return_hidden": True}}
    table = {"stock": (None, m), "darts": (darts, 2 * m), "duet": (duet, m), "das": (das, m),
             "arrol": (arrol, m), "all": ({**darts, **duet, **das, **arrol}, 2 * m)}
    return table[name]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--prompts", type=int, default=6, help="prompts per step")
    ap.add_argument("--m", type=int, default=8, help="samples per prompt in the loss (M)")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--eval-prompts", type=int, default=32)
    ap.add_argument("--eval-every", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(ROOT / "bench-results"))
    args = ap.parse_args()
    names = args.configs.split(",")
    unknown = set(names) - set(CONFIGS)
    if unknown:
        ap.error(f"unknown configuration(s) {sorted(unknown)}; choose from {list(CONFIGS)}")

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"     # weights by reference, the trace
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from quiet import vllm_log_to

    out_dir = Path(args.out)
    log = vllm_log_to(out_dir / "vllm.log")
    import logging
    import warnings

    import torch
    import transformers
    import vllm
    from datasets import Dataset
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOConfig

    from vllm_rl import LLM, Reason
    from vllm_rl.control.duet import percentile
    from vllm_rl.cost import load_cost
    from vllm_rl.engine.trace import CONFIG_KEY as TRACE_KEY, TRACED_SCHEDULER_CLS, engine_trace
    from vllm_rl.integrations.trl.rollout import RolloutFunc, masked_reward
    from vllm_rl.integrations.trl.trainer import RLGRPOTrainer
    from vllm_rl.integrations.verl.feedback import ArrolFeedback
    from vllm_rl.llm import CPU_KV_CACHE_BYTES
    from vllm_rl.weights import load_weights
    from vllm_rl.task import MODEL_PATH, heldout_prompts, reward, train_prompts

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    logging.getLogger("trl").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    cost = load_cost("h100:qwen3-8b")
    common = dict(seed=args.seed, max_model_len=512)
    print("starting the engines (stock vLLM, and vllm_rl with the DAS drafter and ARRoL head)")
    engines = {
        "stock": vllm.LLM(str(MODEL_PATH), async_scheduling=True, scheduler_cls=TRACED_SCHEDULER_CLS,
                          additional_config={TRACE_KEY: True},
                          kv_cache_memory_bytes=CPU_KV_CACHE_BYTES, **common),
        "rl": LLM(das=True, arrol=True, trace=True, **common),
    }
    tok = AutoTokenizer.from_pretrained(MODEL_PATH)
    initial = AutoModelForCausalLM.from_pretrained(MODEL_PATH).state_dict()
    train = Dataset.from_dict({"prompt": train_prompts(args.steps * args.prompts)})
    held = heldout_prompts(args.eval_prompts)

    def task_reward(prompts, completions, **_):
        return [reward(p, c) for p, c in zip(prompts, completions)]

    def accuracy(llm) -> float:
        """Held-out accuracy at the training temperature (the policy RL improves; greedy
        decoding solves nearly every held-out problem already), 4 seeded samples each."""
        sp = vllm.SamplingParams(n=4, temperature=1.0, max_tokens=args.max_tokens, seed=args.seed)
        outs = llm.generate(held, sp, use_tqdm=False)
        return statistics.fmean(reward(p, c.text) for p, o in zip(held, outs) for c in o.outputs)

    results = {}
    for name in names:
        flags, m_prime = technique_flags(name, args.m, args.max_tokens)
        llm = engines["stock" if name == "stock" else "rl"]
        load_weights(llm, initial)
        if name != "stock":
            llm.das_clear()
            llm.arrol_update(None, None, True)            # score only, until calibrated
        rollout = RolloutFunc(llm, flags, redundant=m_prime, max_tokens=args.max_tokens,
                              seed=args.seed, problem_id=lambda p: p)
        feedback = ArrolFeedback(flags["arrol"], cold_start_steps=3) if flags and "arrol" in flags else None
        trace = engine_trace(llm)
        steps: list[dict] = []
        bar = tqdm(total=args.steps, desc=f"{name:>6}", unit="step")

        class Record(TrainerCallback):
            def on_step_end(self, a, state, control, **kw):
                last = rollout.last
                rows = [(p, i, t) for p, infos, texts in zip(last.prompts, last.infos, last.texts)
                        for i, t in zip(infos, texts)]
                kept = [reward(p, t) for p, i, t in rows if (i.selected is not False) and i.weight > 0]
                projected = trace.since(self.mark).project(cost).total_ms / 1000
                row = {"step": state.global_step, "reward": statistics.fmean(kept) if kept else 0.0,
                       "length": last.generated_tokens / max(len(rows), 1),
                       "rollout_s": last.wall_s, "h100_s": projected,
                       "tokens": last.generated_tokens,
                       "ended": {r.value: sum(i.reason is r for _, i, _ in rows) for r in Reason}}
                if state.global_step % args.eval_every == 0 or state.global_step == args.steps:
                    row["heldout"] = accuracy(llm)
                if feedback is not None:
                    update = feedback.observe([i for _, i, _ in rows],
                                              [reward(p, t) for p, _, t in rows])
                    if update is not None:
                        llm.arrol_update(**update)
                if flags and "duet" in flags:
                    lengths = [i.length for _, i, _ in rows if i.valid]
                    if lengths:
                        k1 = int(percentile(lengths, 30))
                        rollout.flags["duet"].update(k1=k1, k2=max(k1, int(percentile(lengths, 80))))
                steps.append(row)
                bar.update(1)
                bar.set_postfix(reward=f"{row['reward']:.2f}", len=f"{row['length']:.0f}")
                self.mark = trace.mark()

            def on_step_begin(self, a, state, control, **kw):
                if not hasattr(self, "mark"):
                    self.mark = trace.mark()

        torch.manual_seed(args.seed)
        model = AutoModelForCausalLM.from_pretrained(MODEL_PATH)
        config = GRPOConfig(
            output_dir=str(out_dir / "grpo_demo_ckpt"), max_steps=args.steps,
            per_device_train_batch_size=args.prompts * args.m, num_generations=args.m,
            gradient_accumulation_steps=1, learning_rate=args.lr, beta=0.0,
            max_completion_length=args.max_tokens, logging_steps=1, report_to=[],
            save_strategy="no", seed=args.seed, use_cpu=True, bf16=False,
            disable_tqdm=True, shuffle_dataset=False)
        trainer = RLGRPOTrainer(model=model, reward_funcs=[masked_reward(task_reward)],
                                args=config, train_dataset=train, processing_class=tok,
                                rollout_func=rollout, callbacks=[Record()])
        trainer.remove_callback(PrinterCallback)          # the bar shows the step's figures
        steps_before = accuracy(llm)
        t0 = time.perf_counter()
        trainer.train()
        bar.close()
        results[name] = {"steps": steps, "heldout_start": steps_before,
                         "train_wall_s": time.perf_counter() - t0, "m_prime": m_prime,
                         "flags": flags}

    summary = summarize(results)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "grpo_demo.json").write_text(json.dumps({"args": vars(args), "summary": summary,
                                                        "runs": results}, indent=1))
    plot(results, out_dir / "grpo_demo.png")
    print_table(summary)
    print(f"\nJSON {out_dir / 'grpo_demo.json'}, PNG {out_dir / 'grpo_demo.png'}, vLLM log {log}")


def summarize(results: dict) -> dict:
    import statistics

    out = {}
    base = results.get("stock")
    for name, r in results.items():
        s = r["steps"]
        tail = s[-5:]
        row = {"heldout_start": r["heldout_start"],
               "heldout_end": next((x["heldout"] for x in reversed(s) if "heldout" in x), None),
               "reward_last5": statistics.fmean(x["reward"] for x in tail),
               "length_last5": statistics.fmean(x["length"] for x in tail),
               "rollout_s": sum(x["rollout_s"] for x in s), "h100_s": sum(x["h100_s"] for x in s),
               "tokens": sum(x["tokens"] for x in s)}
        if base:
            b = base["steps"]
            row["rollout_vs_stock"] = sum(x["rollout_s"] for x in b) / row["rollout_s"]
            row["h100_vs_stock"] = sum(x["h100_s"] for x in b) / row["h100_s"]
        out[name] = row
    return out


def print_table(summary: dict) -> None:
    head = ("config", "held-out acc start→end", "reward (last 5)", "length (last 5)",
            "rollout CPU s", "× stock", "H100 8B s (proj.)", "× stock")
    print("\n| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for name, r in summary.items():
        end = f"{r['heldout_end']:.3f}" if r["heldout_end"] is not None else "–"
        print(f"| {name} | {r['heldout_start']:.3f} → {end} | {r['reward_last5']:.3f} | "
              f"{r['length_last5']:.1f} | {r['rollout_s']:.1f} | {r.get('rollout_vs_stock', 1):.2f} | "
              f"{r['h100_s']:.2f} | {r.get('h100_vs_stock', 1):.2f} |")


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    panels = [("reward", "mean reward (training group)"), ("heldout", "held-out accuracy (T = 1, 4 samples)"),
              ("length", "mean response length (tokens)"), ("rollout_s", "rollout wall time, CPU (s)"),
              ("h100_s", "rollout time, H100 8B projection (s)")]
    fig, axes = plt.subplots(2, 3, figsize=(15, 8.5))
    colors = dict(zip(CONFIGS, ["black", "tab:blue", "tab:orange", "tab:green", "tab:red",
                                "tab:purple"]))
    for ax, (key, title) in zip(axes.flat, panels):
        for name, r in results.items():
            pts = [(0, r["heldout_start"])] if key == "heldout" else []
            pts += [(x["step"], x[key]) for x in r["steps"] if key in x]
            if pts:
                xs, ys = zip(*pts)
                ax.plot(xs, ys, marker="o" if key == "heldout" else None, ms=4,
                        lw=2 if name == "stock" else 1.4, color=colors.get(name), label=name)
        ax.set_title(title, fontsize=11)
        ax.set_xlabel("GRPO step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    axes.flat[0].legend(fontsize=9)
    ax = axes.flat[5]
    names = list(results)
    totals = [sum(x["h100_s"] for x in results[n]["steps"]) for n in names]
    ax.bar(names, totals, color=[colors.get(n) for n in names])
    ax.set_title("total rollout time, H100 8B projection (s)", fontsize=11)
    for i, t in enumerate(totals):
        ax.text(i, t, f"{t:.1f}", ha="center", va="bottom", fontsize=9)
    fig.suptitle("GRPO on the embedded model through the engine (TRL GRPOTrainer, CPU); "
                 "same seeds and steps per configuration", fontsize=12)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
