"""Micro-benchmark of the DAS suffix tree (``vllm_rl.das.SuffixTree``, DAS Sec. 4.1.2).

    python benchmarks/suffix_tree.py [--sizes 10000,100000,1000000] [--depth 64] [--out PATH]

For each corpus and each number of stored tokens it builds a fresh tree of finished
rollouts and measures:

* insert: bulk ``insert`` of finished rollouts, per token (the C++ cost);
* append: ``extend(seq_id, [token])`` one token per call on 16 growing rollouts, per
  token (includes the Python call, as the engine would pay it);
* draft: ``draft(context, 8, 0.1)`` per call (p50 / p99, Python call included) and
  ``draft_batch`` per context, on 2000 cut points of fresh rollouts; mean draft length
  and mean accepted length (leading draft tokens equal to the true continuation);
* memory: ``memory_bytes()`` (exact, allocator overhead excluded) and the growth of the
  malloc heap in use (allocator overhead included, glibc ``mallinfo2``), per stored token
  (DAS reports ~200 B/token), and nodes per token;
* remove: removing the oldest 10% of rollouts (the sliding window), per token; then all
  of them, checking that memory returns exactly to the empty tree's.

Corpora:

* ``task``: the project's task.  Rollouts are teacher traces
  (:func:`vllm_rl.task.problems.teacher_trace`) of the 64 held-out problems, round robin,
  tokenized with the embedded model's tokenizer (vocabulary 256, ~86 tokens per rollout,
  very repetitive); contexts are prompt + a prefix of a fresh trace of the same problem.
* ``markov``: random-structured sequences with a large vocabulary: 64 "problems", each a
  base text of 2000 tokens from a sparse random Markov chain over 32000 token ids; a
  rollout is a noisy copy of its problem's text (3% substitutions, 1% jumps), 300-1500
  tokens; contexts are prefixes of fresh noisy copies.

If ``arctic_inference`` (Arctic Inference, SuffixDecoding; vLLM's ``suffix`` method) is
importable, the same rollouts, growing rollouts and contexts also go through its suffix
tree, measured the same way, and are reported side by side; otherwise that comparison is
reported as skipped.  ``SuffixDecodingCache`` keeps finished responses in one global
``arctic_inference.suffix_decoding._C.SuffixTree`` (plus a per-request prompt tree we do
not have), so the ``arctic`` row drives that native tree directly, at the same level as
ours (one Python call into C++ per operation, Python-side argument conversion included):

* same depth (``--depth``), same draft budget (8) and min prob (0.1);
  ``speculate(context[-depth:], 8, max_spec_factor=8, max_spec_offset=0, 0.1,
  use_tree_spec=False)``.  Arctic caps a draft at ``max_spec_factor * match_len``; a
  factor of 8 = the budget makes that cap inert, as ours has none.  The ``arctic(f=1)``
  row repeats only the drafts with vLLM's default ``suffix_decoding_max_spec_factor=1.0``
  (other columns ``-``);
* insert: ``extend(i, rollout)`` (Arctic has no separate finish); append:
  ``extend(seq_id, [token])`` one token per call, as ours; remove: ``remove``;
* memory: Arctic has no exact count (its ``estimate_memory()`` charges 24 B per stored
  sequence token, ``sizeof(std::vector)``, instead of 4, and skips allocator overhead), so
  its table shows only the malloc heap growth around building the tree (``heap B/tok``,
  same measure as ours); the estimate is in the JSON.  No node count, no batch draft;
* the JSON also has the draft latency through ``SuffixDecodingCache.speculate`` (empty
  prompt tree, the built tree as its global tree), which adds a second native call and a
  Python dataclass per draft: what vLLM's ``suffix`` proposer pays per request and step.

Results: a table on stdout and JSON in ``bench-results/suffix_tree.json``.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from vllm_rl.das import SuffixTree  # noqa: E402

DRAFT_TOKENS, MIN_PROB = 8, 0.1
N_CONTEXTS, N_GROWING = 2000, 16


# --------------------------------------------------------------------------- corpora

def task_corpus(total: int, seed: int):
    """(rollouts, contexts) from the project's task; contexts are (tokens, continuation)."""
    from tokenizers import Tokenizer

    from vllm_rl.task.problems import heldout_problems, teacher_trace

    tok = Tokenizer.from_file(str(ROOT / "vllm_rl" / "task" / "model" / "tokenizer.json"))
    problems = heldout_problems(64)
    rng = random.Random(seed)

    def traces(count, offset=0):
        picked = [problems[(offset + i) % len(problems)] for i in range(count)]
        texts = [teacher_trace(p, rng)[0] for p in picked]
        enc = tok.encode_batch(texts)
        prompts = tok.encode_batch([p.prompt for p in picked])
        return [(pr.ids, e.ids) for pr, e in zip(prompts, enc)]

    rollouts, stored = [], 0
    while stored < total:
        for _, ids in traces(512, offset=len(rollouts)):
            rollouts.append(ids)
            stored += len(ids)
            if stored >= total:
                break
    fresh = traces(N_CONTEXTS + N_GROWING, offset=7)
    contexts = []
    for prompt, ids in fresh[:N_CONTEXTS]:
        cut = rng.randrange(len(ids))
        contexts.append((prompt + ids[:cut], ids[cut:cut + DRAFT_TOKENS]))
    growing = [ids for _, ids in fresh[N_CONTEXTS:]]
    return rollouts, contexts, growing


def markov_corpus(total: int, seed: int):
    rng = random.Random(seed)
    vocab, fanout = 32000, 16
    weights = [1.0 / (r + 1) ** 1.2 for r in range(fanout)]
    successors: dict[int, list[int]] = {}

    def step(t):
        if t not in successors:
            successors[t] = [rng.randrange(vocab) for _ in range(fanout)]
        return rng.choices(successors[t], weights)[0]

    bases = []
    for _ in range(64):
        text = [rng.randrange(vocab)]
        for _ in range(1999):
            text.append(step(text[-1]))
        bases.append(text)

    def copy(base):
        out, i = [], rng.randrange(200)
        length = rng.randint(300, 1500)
        while len(out) < length:
            r = rng.random()
            if r < 0.03:
                out.append(step(out[-1] if out else base[i]))
            elif r < 0.04:
                i = max(0, min(len(base) - 1, i + rng.randint(-50, 50)))
            else:
                out.append(base[i])
            i = (i + 1) % len(base)
        return out

    rollouts, stored = [], 0
    while stored < total:
        x = copy(bases[len(rollouts) % 64])
        rollouts.append(x)
        stored += len(x)
    contexts = []
    for k in range(N_CONTEXTS):
        x = copy(bases[k % 64])
        cut = rng.randrange(len(x))
        contexts.append((x[:cut], x[cut:cut + DRAFT_TOKENS]))
    growing = [copy(bases[k % 64]) for k in range(N_GROWING)]
    return rollouts, contexts, growing


CORPORA = {"task": task_corpus, "markov": markov_corpus}


# --------------------------------------------------------------------------- measuring

class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def heap_bytes() -> int | None:
    """Bytes in use in glibc's malloc (small blocks + mmapped ones), allocator overhead
    included; None off glibc.  The tree allocates through malloc, Python's small objects
    do not, so a delta around tree operations is the tree's real heap footprint."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
    except (OSError, AttributeError):
        return None
    info = libc.mallinfo2()
    return info.uordblks + info.hblkhd


def accepted(draft, truth) -> int:
    n = 0
    for a, b in zip(draft, truth):
        if a != b:
            break
        n += 1
    return n


def remove_all(tree, rollouts) -> float:
    """Remove the oldest 10% of rollouts (timed: the sliding window), then the rest;
    returns microseconds per removed token of the timed part."""
    k = max(1, len(rollouts) // 10)
    t0 = time.perf_counter()
    for i in range(k):
        tree.remove(i)
    remove_s = time.perf_counter() - t0
    for i in range(k, len(rollouts)):
        tree.remove(i)
    return 1e6 * remove_s / sum(len(rollouts[i]) for i in range(k))


def bench_ours(rollouts, contexts, growing, depth: int) -> dict:
    tree = SuffixTree(depth)
    base_bytes = tree.memory_bytes()
    heap0 = heap_bytes()
    t0 = time.perf_counter()
    for i, x in enumerate(rollouts):
        tree.insert(i, x)
    insert_s = time.perf_counter() - t0
    stored = tree.num_tokens()
    mem, nodes = tree.memory_bytes(), tree.num_nodes()
    heap = None if heap0 is None else heap_bytes() - heap0

    # Append one token per call on growing rollouts (removed again afterwards).
    appended, t0 = 0, time.perf_counter()
    for k, x in enumerate(growing):
        sid = 10**9 + k
        for t in x:
            tree.extend(sid, [t])
        appended += len(x)
    append_s = time.perf_counter() - t0
    for k in range(len(growing)):
        tree.remove(10**9 + k)
    assert tree.memory_bytes() == mem

    ctxs = [c for c, _ in contexts]
    lat = []
    drafts = []
    for c in ctxs:
        t0 = time.perf_counter_ns()
        d = tree.draft(c, DRAFT_TOKENS, MIN_PROB)
        lat.append(time.perf_counter_ns() - t0)
        drafts.append(d)
    t0 = time.perf_counter()
    batch = tree.draft_batch(ctxs, DRAFT_TOKENS, MIN_PROB)
    batch_s = time.perf_counter() - t0
    assert batch == drafts

    remove_us_per_token = remove_all(tree, rollouts)
    assert (tree.memory_bytes(), tree.num_nodes()) == (base_bytes, 1), "memory did not return"

    lat.sort()
    return {
        "stored_tokens": stored,
        "rollouts": len(rollouts),
        "insert_us_per_token": 1e6 * insert_s / stored,
        "append_us_per_token": 1e6 * append_s / appended,
        "draft_us_p50": lat[len(lat) // 2] / 1e3,
        "draft_us_p99": lat[int(len(lat) * 0.99)] / 1e3,
        "draft_us_mean": statistics.fmean(lat) / 1e3,
        "draft_batch_us_per_context": 1e6 * batch_s / len(ctxs),
        "draft_len_mean": statistics.fmean(len(d) for d in drafts),
        "accepted_mean": statistics.fmean(accepted(d, t) for d, (_, t) in zip(drafts, contexts)),
        "memory_bytes_per_token": mem / stored,
        "heap_bytes_per_token": None if heap is None else heap / stored,
        "nodes_per_token": (nodes - 1) / stored,
        "remove_us_per_token": remove_us_per_token,
        "memory_returned_to_base": True,
    }


def _timed_drafts(draft, contexts):
    """Per-call latencies (ns, sorted) and the drafts of ``draft(context)`` on every context."""
    lat, drafts = [], []
    for c, _ in contexts:
        t0 = time.perf_counter_ns()
        d = draft(c)
        lat.append(time.perf_counter_ns() - t0)
        drafts.append(list(d))
    lat.sort()
    return lat, drafts


def _draft_stats(lat, drafts, contexts) -> dict:
    return {
        "draft_us_p50": lat[len(lat) // 2] / 1e3,
        "draft_us_p99": lat[int(len(lat) * 0.99)] / 1e3,
        "draft_us_mean": statistics.fmean(lat) / 1e3,
        "draft_len_mean": statistics.fmean(len(d) for d in drafts),
        "accepted_mean": statistics.fmean(accepted(d, t) for d, (_, t) in zip(drafts, contexts)),
    }


def bench_arctic(rollouts, contexts, growing, depth: int) -> dict:
    """The same corpus through Arctic Inference's suffix tree (the global tree of its
    ``SuffixDecodingCache``), measured as :func:`bench_ours` (see the module docstring).

    Returns ``{"arctic": ..., "arctic_f1": ...}``: the second holds only the drafts with
    vLLM's default ``max_spec_factor=1.0``."""
    from arctic_inference.suffix_decoding import SuffixDecodingCache
    from arctic_inference.suffix_decoding._C import SuffixTree as ArcticTree

    tree = ArcticTree(depth)
    heap0 = heap_bytes()
    t0 = time.perf_counter()
    for i, x in enumerate(rollouts):
        tree.extend(i, x)
    insert_s = time.perf_counter() - t0
    stored = sum(len(x) for x in rollouts)
    heap = None if heap0 is None else heap_bytes() - heap0
    estimate = tree.estimate_memory()

    appended, t0 = 0, time.perf_counter()
    for k, x in enumerate(growing):
        sid = len(rollouts) + k          # Arctic's sequence ids are int32
        for t in x:
            tree.extend(sid, [t])
        appended += len(x)
    append_s = time.perf_counter() - t0
    for k in range(len(growing)):
        tree.remove(len(rollouts) + k)

    def speculate(factor):
        return lambda c: tree.speculate(c[-depth:], DRAFT_TOKENS, factor, 0.0, MIN_PROB,
                                        False).token_ids

    lat, drafts = _timed_drafts(speculate(float(DRAFT_TOKENS)), contexts)
    f1 = _draft_stats(*_timed_drafts(speculate(1.0), contexts), contexts)
    f1["max_spec_factor"] = 1.0

    # Through the cache, as vLLM's proposer calls it (no global slot: max_cached_requests=0).
    cache = SuffixDecodingCache(max_tree_depth=depth, max_cached_requests=0)
    cache._global_tree = tree
    cache.start_request("bench", [])
    cache_lat, cache_drafts = _timed_drafts(
        lambda c: cache.speculate("bench", c, max_spec_tokens=DRAFT_TOKENS,
                                  max_spec_factor=float(DRAFT_TOKENS),
                                  min_token_prob=MIN_PROB).token_ids, contexts)
    cache.stop_request("bench")
    assert cache_drafts == drafts

    remove_us_per_token = remove_all(tree, rollouts)
    residual = None if heap0 is None else heap_bytes() - heap0

    return {"arctic": {
        "stored_tokens": stored,
        "rollouts": len(rollouts),
        "insert_us_per_token": 1e6 * insert_s / stored,
        "append_us_per_token": 1e6 * append_s / appended,
        **_draft_stats(lat, drafts, contexts),
        "max_spec_factor": float(DRAFT_TOKENS),
        "cache_draft_us_p50": cache_lat[len(cache_lat) // 2] / 1e3,
        "cache_draft_us_p99": cache_lat[int(len(cache_lat) * 0.99)] / 1e3,
        "memory_bytes_per_token": None,
        "estimate_memory_bytes_per_token": estimate / stored,
        "heap_bytes_per_token": None if heap is None else heap / stored,
        "remove_us_per_token": remove_us_per_token,
        "heap_bytes_left_after_removing_all": residual,
    }, "arctic_f1": f1}


def fmt(v, nd=2):
    return "-" if v is None else (f"{v:.{nd}f}" if isinstance(v, float) else str(v))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10000,100000,1000000")
    ap.add_argument("--corpora", default="task,markov")
    ap.add_argument("--depth", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(ROOT / "bench-results" / "suffix_tree.json"))
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]

    try:
        from importlib.metadata import version

        import arctic_inference  # noqa: F401
        arctic = version("arctic_inference")
    except ImportError:
        arctic = None

    rows = []
    for corpus in args.corpora.split(","):
        for size in sizes:
            rollouts, contexts, growing = CORPORA[corpus](size, args.seed)
            row = {"corpus": corpus, "target_tokens": size,
                   "ours": bench_ours(rollouts, contexts, growing, args.depth)}
            if arctic:
                try:
                    row.update(bench_arctic(rollouts, contexts, growing, args.depth))
                except Exception as e:  # report, keep the rest of the run
                    row["arctic"] = {"error": f"{type(e).__name__}: {e}"}
            rows.append(row)
            print(f"done {corpus} {size}", file=sys.stderr, flush=True)

    cols = [("stored_tokens", "tokens", 0), ("insert_us_per_token", "insert us/tok", 2),
            ("append_us_per_token", "append us/tok", 2), ("draft_us_p50", "draft p50 us", 2),
            ("draft_us_p99", "draft p99 us", 2), ("draft_batch_us_per_context", "batch us/ctx", 2),
            ("draft_len_mean", "draft len", 2), ("accepted_mean", "accepted", 2),
            ("memory_bytes_per_token", "B/tok", 1), ("heap_bytes_per_token", "heap B/tok", 1),
            ("nodes_per_token", "nodes/tok", 2), ("remove_us_per_token", "remove us/tok", 2)]
    header = ["corpus", "impl"] + [c[1] for c in cols]
    lines = [header]
    for row in rows:
        for impl, label in (("ours", "ours"), ("arctic", "arctic"), ("arctic_f1", "arctic(f=1)")):
            r = row.get(impl)
            if r is None:
                continue
            if "error" in r:
                lines.append([row["corpus"], label, r["error"]])
                continue
            lines.append([row["corpus"], label] + [fmt(r.get(k), nd) for k, _, nd in cols])
    widths = [max(len(line[i]) for line in lines if i < len(line) and len(line) > 3)
              for i in range(len(header))]
    for line in lines:
        print("  ".join(cell.rjust(w) for cell, w in zip(line, widths)))
    if not arctic:
        print("arctic_inference is not importable: the side-by-side comparison was skipped.")

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "benchmark": "suffix_tree",
        "max_depth": args.depth, "draft_tokens": DRAFT_TOKENS, "min_prob": MIN_PROB,
        "contexts": N_CONTEXTS, "growing_rollouts": N_GROWING,
        "machine": {"python": platform.python_version(), "platform": platform.platform(),
                    "cpus": os.cpu_count()},
        "arctic_inference": (f"compared (arctic_inference {arctic}; max_spec_factor "
                             f"{DRAFT_TOKENS} in 'arctic', 1.0 in 'arctic_f1')")
                            if arctic else "skipped (not importable)",
        "rows": rows,
    }, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
