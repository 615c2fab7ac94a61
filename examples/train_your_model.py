"""Train your Hugging Face causal LM with TRL's GRPO, rollouts from the vllm_rl engine.

    python examples/train_your_model.py --model Qwen/Qwen3-0.6B     # a Hugging Face id or a folder
    python examples/train_your_model.py --model vllm_rl/task/model --steps 2 --prompts 3 \\
        --m 4 --max-tokens 64 --lr 1e-4       # the embedded 14 MB demo model: ~1.5 min on 2 CPU cores

One model, two copies: TRL trains it, the engine generates with it (``LLM(model)``).
``RolloutFunc`` (:mod:`vllm_rl.integrations.trl.rollout`) loads the trainer's weights into
the engine before every step's rollout, sends each prompt once with the flags and gives
TRL M samples per prompt with their real tokens, log-probs and records; ``masked_reward``
and ``RLGRPOTrainer`` put the records in the loss.  The default is the combination
fastest to accuracy (``docs/benchmarks.md``): DAS with partial rollouts (a step ends once
half its groups are complete, the rest carry on into the next step).  ``--techniques``
adds DARTS, DUET and ARRoL (each one flag, ``docs/flags.md``); ``--no-partial`` keeps
every token on the step's own weights.  After training the script loads the last step's
weights too and checks that the engine and the trainer agree: the same log-probs for the
engine's greedy tokens.

Your task is ``my_prompts`` and ``my_reward`` below.  Here they are the demo kit's arithmetic
prompts and verifier (``vllm_rl.task``; plain text, no chat template), which any model can
attempt: the answer goes in ``\\boxed{N}``, and DUET's marker is that box.
"""
from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")      # TRL calls rollout_func experimental

MARKER = r"\\boxed\{[^}]*\}"             # DUET's answer marker: the end of a finished answer
TECHNIQUES = ("das", "darts", "duet", "arrol")


def my_prompts(n: int) -> list[str]:
    """Your training prompts (here: the demo kit's)."""
    from vllm_rl.task import train_prompts

    return train_prompts(n)


def my_reward(prompt: str, completion: str) -> float:
    """Your verifier (here: the demo kit's, 1.0 for the right boxed answer)."""
    from vllm_rl.task import reward

    return reward(prompt, completion)


def trl_reward(prompts, completions, **_) -> list[float]:
    return [my_reward(p, c) for p, c in zip(prompts, completions)]


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--model", required=True, help="your model: a Hugging Face id or a folder")
    ap.add_argument("--steps", type=int, default=20, help="GRPO steps (default 20)")
    ap.add_argument("--prompts", type=int, default=8, help="prompts per step (default 8)")
    ap.add_argument("--m", type=int, default=8, help="samples per prompt in the loss, M")
    ap.add_argument("--max-tokens", type=int, default=256, help="generation cap (default 256)")
    ap.add_argument("--max-model-len", type=int, default=1024)
    ap.add_argument("--dtype", default="auto",
                    help="the engine's dtype (default auto, vLLM's choice: bfloat16 on a CPU)")
    ap.add_argument("--techniques", default="das",
                    help=f"comma-separated, among {', '.join(TECHNIQUES)} (default das: "
                         "with partial rollouts, the fastest to accuracy measured)")
    ap.add_argument("--no-partial", dest="partial", action="store_false",
                    help="no partial rollouts: every step's samples start and end on its "
                         "own weights (default: partial rollouts, APRIL)")
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--l-detect", type=int, default=None,
                    help="ARRoL's l_detect (default: a quarter of --max-tokens)")
    ap.add_argument("--gpu-memory", type=float, default=0.3,
                    help="the engine's share of the GPU, beside the trainer (default 0.3)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="train-your-model", help="TRL's output_dir")
    ap.add_argument("--report", help="write the steps' records and the sync check here (JSON)")
    return ap


def main(argv: list[str] | None = None) -> dict:
    args = parser().parse_args(argv)
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig

    from vllm_rl import LLM
    from vllm_rl.arrol import ArrolFeedback
    from vllm_rl.integrations.trl.rollout import RolloutFunc, masked_reward
    from vllm_rl.integrations.trl.trainer import RLGRPOTrainer

    t0, gpu = time.perf_counter(), torch.cuda.is_available()
    # -- your model, in the trainer and in the engine; the flags on; the drop-in syncs --
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    llm = LLM(model=args.model, das=True, arrol=True, seed=args.seed,     # the same model
              max_model_len=args.max_model_len, dtype=args.dtype,
              **({"gpu_memory_utilization": args.gpu_memory} if gpu else {}))
    flags = technique_flags(args)
    feedback = None if "arrol" not in flags else ArrolFeedback(
        flags["arrol"], hidden_size=model.config.get_text_config().hidden_size)
    rollout = RolloutFunc(llm, flags, max_tokens=args.max_tokens, seed=args.seed,
                          reward=my_reward, arrol_feedback=feedback, partial=args.partial)
    config = GRPOConfig(output_dir=args.out, max_steps=args.steps, num_generations=args.m,
                        per_device_train_batch_size=args.prompts * args.m,
                        max_completion_length=args.max_tokens, learning_rate=args.lr,
                        beta=0.0, seed=args.seed, logging_steps=1, report_to=[],
                        save_strategy="no", use_cpu=not gpu,
                        bf16=gpu and torch.cuda.is_bf16_supported())
    records = step_records(rollout)
    trainer = RLGRPOTrainer(model=model, reward_funcs=[masked_reward(trl_reward)],
                            args=config, processing_class=tokenizer, rollout_func=rollout,
                            train_dataset=Dataset.from_dict(
                                {"prompt": my_prompts(args.steps * args.prompts)}),
                            callbacks=[records])
    before = sync_check(llm, trainer, my_prompts(4))
    trainer.train()
    rollout.load(trainer)        # RolloutFunc syncs before each step; the last step's too
    # ------------------------------------------------------------------------------------
    after = sync_check(llm, trainer, my_prompts(4))
    moved = policy_moved(trainer, before)
    report = {"model": args.model, "steps": records.steps, "global_step": trainer.state.global_step,
              "loaded_step": rollout.loaded_step, "techniques": list(flags),
              "partial": args.partial,
              "sync": {"before_max_abs_dlogp": before["max_abs"],
                       "after_max_abs_dlogp": after["max_abs"], "policy_moved": moved},
              "wall_s": time.perf_counter() - t0}
    print(f"engine vs trainer, max |d log-prob| on the engine's greedy tokens: "
          f"{before['max_abs']:.1e} before training, {after['max_abs']:.1e} after; the policy "
          f"moved by {moved:.1e} on the same tokens; {report['wall_s']:.0f} s", flush=True)
    if args.report:
        with open(args.report, "w") as f:
            json.dump(report, f, indent=1)
    return report


def technique_flags(args) -> dict:
    """The flags of ``--techniques``: each technique with its paper's defaults (DUET's
    marker is the box, ARRoL scores at a quarter of ``max_tokens``)."""
    chosen = [t.strip() for t in args.techniques.split(",") if t.strip()]
    unknown = sorted(set(chosen) - set(TECHNIQUES))
    if unknown:
        raise SystemExit(f"--techniques: unknown {unknown}; choose among {TECHNIQUES}")
    every = {"das": {}, "darts": {}, "duet": {"pattern": MARKER},
             "arrol": {"l_detect": args.l_detect or max(1, args.max_tokens // 4),
                       "return_hidden": True}}
    return {t: every[t] for t in chosen}


# ------------------------------------------------------------------ what the run reports


def step_records(rollout):
    """A TRL callback keeping each step's records, as the engine returned them
    (``RolloutFunc.last``), in its ``steps``."""
    from transformers import TrainerCallback

    class StepRecords(TrainerCallback):
        steps: list[dict] = []

        def on_step_end(self, args, state, control, **kwargs):
            last = rollout.last
            infos = [i for group in last.infos for i in group]
            marks = [m for group in last.marks for m in group]
            texts = [t for group in last.texts for t in group]
            prompts = [p for p, group in zip(last.prompts, last.infos) for _ in group]
            kept = [my_reward(p, t) for p, t, m in zip(prompts, texts, marks) if m.keep]
            reasons: dict[str, int] = {}
            for i in infos:
                reasons[i.reason.value] = reasons.get(i.reason.value, 0) + 1
            row = {"step": state.global_step, "prompts": len(last.prompts),
                   "records": len(infos), "in_loss": len(kept), "reasons": reasons,
                   "reward_in_loss": sum(kept) / len(kept) if kept else 0.0,
                   "generated_tokens": last.generated_tokens, "rollout_s": last.wall_s,
                   "carried": last.carried,
                   "engine_weights_of_step": rollout.loaded_step}
            self.steps.append(row)
            print(f"step {row['step']}: {row['records']} samples for {row['prompts']} "
                  f"prompts, {row['in_loss']} in the loss, reward {row['reward_in_loss']:.2f}, "
                  f"ends {reasons}", flush=True)

    callback = StepRecords()
    callback.steps = []
    return callback


def _token_logprobs(model, prompt_ids: list[int], ids: list[int]) -> list[float]:
    """The trainer model's log-probs of ``ids`` after ``prompt_ids``."""
    import torch

    x = torch.tensor([list(prompt_ids) + list(ids)], device=model.device)
    training = model.training
    model.eval()
    try:
        with torch.no_grad():
            logits = model(x).logits[0, len(prompt_ids) - 1:-1].float()
    finally:
        model.train(training)
    lp = torch.log_softmax(logits, dim=-1)
    return lp.gather(1, torch.tensor(ids, device=lp.device).view(-1, 1)).view(-1).tolist()


def sync_check(llm, trainer, prompts: list[str], max_tokens: int = 16) -> dict:
    """Engine and trainer on the same weights?  The largest |log-prob difference| on the
    engine's greedy tokens (a float32 engine: ~1e-5; a bfloat16 one: ~1e-2)."""
    from vllm import SamplingParams

    model = trainer.accelerator.unwrap_model(trainer.model)
    sp = SamplingParams(temperature=0.0, max_tokens=max_tokens, logprobs=0)
    rows, worst = [], 0.0
    for out in llm.generate(prompts, sp, use_tqdm=False):
        c = out.outputs[0]
        ids = list(c.token_ids)
        engine = [lp[t].logprob for lp, t in zip(c.logprobs, ids)]
        mine = _token_logprobs(model, out.prompt_token_ids, ids)
        worst = max([worst] + [abs(a - b) for a, b in zip(engine, mine)])
        rows.append((list(out.prompt_token_ids), ids, engine))
    return {"max_abs": worst, "rows": rows}


def policy_moved(trainer, before: dict) -> float:
    """How far training moved the policy: the largest |log-prob change| on the tokens of
    the check before training."""
    model = trainer.accelerator.unwrap_model(trainer.model)
    return max([0.0] + [abs(a - b) for prompt, ids, engine in before["rows"]
                        for a, b in zip(engine, _token_logprobs(model, prompt, ids))])


if __name__ == "__main__":
    main()
