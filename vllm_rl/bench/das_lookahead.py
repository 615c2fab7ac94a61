"""The lookahead's tree call per drafting row, without an engine.

    python -m vllm_rl.bench.das_lookahead                  # 1,024 rows, k 0/4/8, H 1/8
    python -m vllm_rl.bench.das_lookahead --rows 128 --sound 2 --hypotheses 2 8 64
    python -m vllm_rl.bench.das_lookahead --sound 4 --hypotheses 8 --threads 1 2 4

Under async scheduling the DAS drafter builds each step's hypotheses in one C++ call
(:func:`vllm_rl.das.hypotheses.build`, ``tree.hypothesis_drafts``).  This times that call
alone on a synthetic step: ``rows`` rows, ``group`` per problem, each problem's tree
holding ``prebuilt`` noisy copies of its text (as :mod:`vllm_rl.bench.das_host`); each
row's context is its own noisy copy cut at a random point, and the ``k`` drafts it
verifies in the step on the device are the tree's draft after that context (what the
drafter gave it), so the row's outcomes are those of a real draft.  The call's own CPU
time per row (ns, summed over its threads) and its wall time per row, each the best of
``repeats`` calls in one process: the trees' memory layout
differs from process to process, and the figure with it (up to 5× for the cheapest
calls on this machine), so compare settings within a run and builds over several runs.
"""
from __future__ import annotations

import argparse
import random

import numpy as np

from vllm_rl.bench.das_host import noisy


def _step(rows: int, group: int, prebuilt: int, length: int, vocab: int, noise: float,
          depth: int, seed: int):
    """The trees (a table and a list) and each row's (tree, context)."""
    from vllm_rl.das.tree import SuffixTree, TreeTable

    rng = random.Random(seed)
    table, trees, rows_of = TreeTable(), [], []
    for j in range(max(1, rows // group)):
        tree = SuffixTree(depth)
        text = [rng.randrange(3, vocab) for _ in range(length)]
        for g in range(prebuilt):
            tree.insert(j * prebuilt + g, noisy(rng, text, noise))
        table.add(tree)
        trees.append(tree)
        for _ in range(group):
            cut = rng.randrange(depth, length - depth)
            rows_of.append((j, noisy(rng, text, noise)[cut - depth:cut]))
    return table, trees, rows_of[:rows]


def measure(rows: int = 1024, sound=(0, 4, 8), hypotheses=(1, 8), branches: int = 4,
            budget: int = 8, min_prob: float = 0.3, group: int = 8, prebuilt: int = 8,
            length: int = 512, vocab: int = 400, noise: float = 0.1, depth: int = 32,
            repeats: int = 5, seed: int = 0, threads=(1,)) -> list[dict]:
    """ns per row of ``hypothesis_drafts`` for each (k, H, threads), CPU and wall: best
    of ``repeats`` calls."""
    import time

    from vllm_rl.das import hypotheses as hyp
    from vllm_rl.das.tree import draft_many, hypothesis_drafts

    table, trees, rows_of = _step(rows, group, prebuilt, length, vocab, noise, depth, seed)
    n = len(rows_of)
    tree_idx = np.array([j for j, _ in rows_of], np.int32)
    contexts = np.array([c for _, c in rows_of], np.int32)
    context_len = np.full(n, depth, np.int32)
    k_max = max(sound)
    own = draft_many([trees[j] for j, _ in rows_of], [c for _, c in rows_of], k_max, 0.0,
                     backoff=True)
    verified = np.zeros((n, max(k_max, 1)), np.int32)
    drafted = np.zeros(n, np.int64)
    for i, d in enumerate(own):
        verified[i, :len(d)] = d
        drafted[i] = len(d)
    out = []
    for k in sound:
        ks = np.minimum(drafted, k)             # a row verifies what the tree drafted
        for most in hypotheses:
            H = hyp.per_row(ks, branches, most)
            for th in threads:
                cpu = wall = float("inf")
                for _ in range(repeats):
                    t0 = time.perf_counter_ns()
                    ns = hypothesis_drafts(table, tree_idx, contexts, context_len, verified,
                                           ks, np.full(n, budget, np.int32),
                                           np.full(n, min_prob), branches, H, th)[-1]
                    wall = min(wall, time.perf_counter_ns() - t0)
                    cpu = min(cpu, ns)
                out.append({"rows": n, "k": k, "mean_k": float(ks.mean()), "hypotheses": most,
                            "threads": th, "ns_per_row": cpu / n, "wall_ns_per_row": wall / n})
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1024)
    ap.add_argument("--sound", type=int, nargs="+", default=[0, 4, 8],
                    help="drafts each row verifies in the step on the device (k)")
    ap.add_argument("--hypotheses", type=int, nargs="+", default=[1, 8],
                    help="most likely outcomes a row keeps (H)")
    ap.add_argument("--branches", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, nargs="+", default=[1],
                    help="threads the call may share its rows among (DASConfig.threads)")
    args = ap.parse_args(argv)
    print("| rows | k (mean) | hypotheses a row | threads | CPU ns per row | wall ns per row |")
    print("|---|---|---|---|---|---|")
    for r in measure(args.rows, args.sound, args.hypotheses, args.branches,
                     repeats=args.repeats, threads=args.threads):
        print(f"| {r['rows']} | {r['k']} ({r['mean_k']:.1f}) | {r['hypotheses']} | "
              f"{r['threads']} | {r['ns_per_row']:.0f} | {r['wall_ns_per_row']:.0f} |",
              flush=True)


if __name__ == "__main__":
    main()
