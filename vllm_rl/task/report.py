"""Statistics of the embedded policy on the held-out prompts (the foundation issue's item 3).

    python -m vllm_rl.task.report [--model PATH] [--prompts 64] [--samples 16]

Samples every held-out prompt at temperature 1.0 through vLLM and prints the
intra-prompt long tail, accuracy and its mix within groups, the length/correctness
patterns of DARTS (Pattern I: long answers more often wrong; Pattern II: prompts whose
right answers are longer), and how much of a sample repeats its siblings' 4-grams.
"""
from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import asdict, dataclass

from vllm_rl.task import MODEL_PATH
from vllm_rl.task.problems import heldout_prompts, reward

MAX_TOKENS = 256   # the task's rollout length limit


@dataclass
class Report:
    prompts: int
    samples: int
    max_tokens: int
    median_longest_over_median: float
    share_at_length_limit: float
    prompts_with_limit_hit: int
    accuracy: float
    groups_mixed: float
    accuracy_shorter_half: float
    accuracy_longer_half: float
    pattern_ii_prompts: int
    sibling_4gram_overlap: float
    other_prompt_4gram_overlap: float
    mean_length: float

    def checks(self) -> dict[str, bool]:
        """The foundation issue's targets."""
        return {
            "long tail: median(longest/median) >= 3": self.median_longest_over_median >= 3,
            "some samples reach the length limit": self.share_at_length_limit > 0,
            "accuracy in [0.3, 0.8]": 0.3 <= self.accuracy <= 0.8,
            "most groups mix right and wrong": self.groups_mixed > 0.5,
            "Pattern I: longer half less accurate": self.accuracy_longer_half < self.accuracy_shorter_half,
            "Pattern II: some prompts' right answers are longer": self.pattern_ii_prompts > 0,
            "siblings repeat structure": self.sibling_4gram_overlap > self.other_prompt_4gram_overlap,
        }


def _grams(tokens: list[int], n: int = 4) -> set[tuple[int, ...]]:
    return {tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)}


def _overlap(sample: list[int], others: list[list[int]]) -> float:
    mine = _grams(sample)
    if not mine:
        return 0.0
    pool = set().union(*(_grams(o) for o in others))
    return len(mine & pool) / len(mine)


def compute(prompts: list[str], groups: list[list[tuple[list[int], str, bool]]],
            max_tokens: int) -> Report:
    """``groups[i]`` holds (token ids, text, cut at the limit) for each sample of prompt i."""
    ratios, rewards, mixed, pattern_ii, by_len = [], [], 0, 0, []
    sib, other, limit_prompts, n_limit = [], [], 0, 0
    for i, (prompt, group) in enumerate(zip(prompts, groups)):
        lengths = [len(t) for t, _, _ in group]
        rs = [reward(prompt, text) for _, text, _ in group]
        ratios.append(max(lengths) / max(1.0, statistics.median(lengths)))
        rewards += rs
        mixed += 0 < sum(rs) < len(rs)
        cut = sum(c for _, _, c in group)
        n_limit += cut
        limit_prompts += cut > 0
        right = [n for n, r in zip(lengths, rs) if r > 0]
        wrong = [n for n, r, (_, _, c) in zip(lengths, rs, group) if r == 0 and not c]
        if right and wrong and statistics.mean(right) > statistics.mean(wrong):
            pattern_ii += 1
        by_len += list(zip(lengths, rs))
        # 4-gram overlap of a sample with its siblings, and with as many samples of the
        # next prompt (the baseline any two samples of the task share).
        toks = [t for t, _, _ in group]
        neighbours = [t for t, _, _ in groups[(i + 1) % len(groups)]][:len(toks) - 1]
        sib += [_overlap(t, toks[:j] + toks[j + 1:]) for j, t in enumerate(toks[:4])]
        other += [_overlap(t, neighbours) for t in toks[:4]]
    by_len.sort(key=lambda x: x[0])
    half = len(by_len) // 2
    n = sum(len(g) for g in groups)
    return Report(
        prompts=len(prompts), samples=len(groups[0]), max_tokens=max_tokens,
        median_longest_over_median=statistics.median(ratios),
        share_at_length_limit=n_limit / n, prompts_with_limit_hit=limit_prompts,
        accuracy=sum(rewards) / n, groups_mixed=mixed / len(groups),
        accuracy_shorter_half=sum(r for _, r in by_len[:half]) / half,
        accuracy_longer_half=sum(r for _, r in by_len[half:]) / (n - half),
        pattern_ii_prompts=pattern_ii,
        sibling_4gram_overlap=statistics.mean(sib), other_prompt_4gram_overlap=statistics.mean(other),
        mean_length=statistics.mean(x for x, _ in by_len))


def sample(llm, prompts: list[str], samples: int, max_tokens: int, seed: int = 0):
    from vllm import SamplingParams

    sp = SamplingParams(n=samples, temperature=1.0, max_tokens=max_tokens, seed=seed)
    outs = llm.generate(prompts, sp, use_tqdm=False)
    return [[(list(c.token_ids), c.text, c.finish_reason == "length") for c in o.outputs]
            for o in outs]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(MODEL_PATH),
                    help="model path (default: the embedded model)")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=MAX_TOKENS)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="also write the report here")
    args = ap.parse_args()

    from vllm_rl.llm import LLM

    llm = LLM(args.model, seed=args.seed, max_model_len=1024)
    prompts = heldout_prompts(args.prompts)
    report = compute(prompts, sample(llm, prompts, args.samples, args.max_tokens, args.seed),
                     args.max_tokens)
    for key, value in asdict(report).items():
        print(f"{key:32s} {value:.3f}" if isinstance(value, float) else f"{key:32s} {value}")
    ok = report.checks()
    for name, passed in ok.items():
        print(f"[{'ok' if passed else 'MISS'}] {name}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"report": asdict(report), "checks": ok}, f, indent=2)


if __name__ == "__main__":
    main()
