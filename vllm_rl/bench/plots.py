"""The pictures ``vllm-rl bench`` and ``vllm-rl serve-bench`` write beside their JSON.

- :func:`length_cdf`: the cumulative distribution of generated lengths, one line per
  configuration (the long tail the RL rollout papers start from);
- :func:`running`: requests (sequences) running over time or engine steps, one line per
  configuration (the tail of a step: a few long samples keep the batch small while
  everyone waits);
- :func:`timeline`: a stretch of engine steps laid out in time, per engine: the forward
  pass (projected), the host work that overlaps it and the host work on its path;
- :func:`speedups`: speed-up over stock against live sequences, one line per
  configuration (the operating-point table).

matplotlib with the Agg backend; nothing is shown on screen.
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

# Distinct, colour-blind-friendly lines; stock runs dashed grey/black so they read as baselines.
_COLOURS = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442",
            "#882255", "#44AA99", "#999933"]


def _styles(names: Sequence[str]) -> dict[str, dict]:
    out, i = {}, 0
    stock_colours = iter(["#222222", "#777777", "#AAAAAA"])
    for name in names:
        if name.startswith("stock"):
            out[name] = {"color": next(stock_colours, "#555555"), "linestyle": "--",
                         "linewidth": 2.0}
        else:
            out[name] = {"color": _COLOURS[i % len(_COLOURS)], "linewidth": 1.6}
            i += 1
    return out


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def pyplot():
    """matplotlib's pyplot on the file backend."""
    return _plt()


def save(fig, path: str | Path, dpi: int | None = None) -> Path:
    """Lay ``fig`` out, write it to ``path`` and close it."""
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=dpi)
    _plt().close(fig)
    return path


def length_cdf(lengths: Mapping[str, Sequence[int]], path: str | Path, title: str,
               max_tokens: int | None = None) -> Path:
    """One CDF line per configuration: share of samples with at most x generated tokens."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 5), dpi=120)
    styles = _styles(list(lengths))
    for name, ls in lengths.items():
        if not ls:
            continue
        xs = sorted(ls)
        n = len(xs)
        ax.step(xs, [(i + 1) / n for i in range(n)], where="post",
                label=f"{name} (n={n}, p50 {xs[n // 2]}, max {xs[-1]})", **styles[name])
    if max_tokens:
        ax.axvline(max_tokens, color="#999999", linewidth=0.8, linestyle=":")
        ax.annotate("max_tokens", (max_tokens, 0.45), xytext=(-3, 0),
                    textcoords="offset points", color="#555555", fontsize=8, rotation=90,
                    va="center", ha="right",
                    bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.85, "pad": 1})
    ax.set_xlabel("generated tokens per sample")
    ax.set_ylabel("share of samples (CDF)")
    ax.set_ylim(0, 1.01)
    ax.set_xlim(left=0)
    ax.grid(alpha=0.3)
    ax.set_title(title, fontsize=11)
    ax.legend(fontsize=8, loc="lower right", framealpha=0.9)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path


def running(series: Mapping[str, tuple[Sequence[float], Sequence[int]]], path: str | Path,
            title: str, xlabel: str, second: Mapping[str, tuple[Sequence[float],
                                                               Sequence[int]]] | None = None,
            second_xlabel: str = "", ylabel: str = "running samples") -> Path:
    """Running requests over x, one line per configuration: ``series[name] = (xs, counts)``.
    With ``second``, a second panel below (e.g. the same runs over engine steps)."""
    plt = _plt()
    rows = 2 if second else 1
    fig, axes = plt.subplots(rows, 1, figsize=(9, 4.2 * rows), dpi=120, squeeze=False)
    styles = _styles(list(series))
    for ax, data, label in ((axes[0][0], series, xlabel),) + (
            ((axes[1][0], second, second_xlabel),) if second else ()):
        for name, (xs, ys) in data.items():
            if len(xs):
                ax.step(xs, ys, where="post", label=name, **styles.get(name, {}))
        ax.set_xlabel(label)
        ax.set_ylabel(ylabel)
        ax.set_xlim(left=0)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="upper right", framealpha=0.9)
    axes[0][0].set_title(title, fontsize=11)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path


def timeline(lanes: Mapping[str, tuple[Sequence[float], ...]],
             path: str | Path, title: str) -> Path:
    """Engine steps laid out in time, one panel per entry: ``lanes[name] = (gpu_ms,
    core_ms, worker_ms, path_ms, asynchronous)`` per step
    (:func:`vllm_rl.cost.host.host_counted`'s parts).  Synchronous: the host work (core
    + worker + path), then the forward pass.  Asynchronous: the path part (after a wait
    for the device: a DAS step that drafts), then the forward pass with the core and
    worker parts (scheduling, output processing, the drafter's feeding, the scorer)
    beside it; the next step starts when both are done."""
    plt = _plt()
    names = list(lanes)
    fig, axes = plt.subplots(len(names), 1, figsize=(11, 1.9 * len(names) + 0.8), dpi=120,
                             squeeze=False, sharex=True)
    colours = {"GPU forward (projected)": "#0072B2", "host, overlapped": "#BBBBBB",
               "host, on the path": "#D55E00"}
    for ax, name in zip((a[0] for a in axes), names):
        gpu, core, worker, on_path, asynchronous = lanes[name]
        t = 0.0
        bars = {k: [] for k in colours}
        for g, c, w, p in zip(gpu, core, worker, on_path):
            if asynchronous:
                bars["host, on the path"].append((t, p))
                bars["GPU forward (projected)"].append((t + p, g))
                bars["host, overlapped"].append((t + p, c + w))
                t += p + max(g, c + w)
            else:
                bars["host, on the path"].append((t, c + w + p))
                bars["GPU forward (projected)"].append((t + c + w + p, g))
                t += c + w + p + g
        rows = {"GPU forward (projected)": 2, "host, overlapped": 1, "host, on the path": 0}
        for label, spans in bars.items():
            ax.broken_barh([s for s in spans if s[1] > 0], (rows[label] - 0.4, 0.8),
                           facecolors=colours[label], edgecolor="white", linewidth=0.3,
                           label=label)
        ax.set_yticks([0, 1, 2], ["on path", "overlapped", "GPU"], fontsize=8)
        ax.set_ylim(-0.6, 2.6)
        ax.set_title(f"{name}: {len(gpu)} steps in {t:.1f} ms", fontsize=9, loc="left")
        ax.grid(alpha=0.3, axis="x")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=8, loc="lower center", ncol=3, framealpha=0.9)
    axes[-1][0].set_xlabel("ms (forward passes projected, host time measured on this CPU)")
    fig.suptitle(title, fontsize=11)
    fig.tight_layout(rect=(0, 0.035, 1, 1))
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path


def speedups(lines: Mapping[str, tuple[Sequence[float], Sequence[float], Sequence[float],
                                       Sequence[float]]],
             path: str | Path, title: str, ylabel: str,
             dashed: Mapping[str, tuple[Sequence[float], Sequence[float]]] | None = None) -> Path:
    """Speed-up against x (live sequences, log scale), one line per configuration:
    ``lines[name] = (xs, means, lows, highs)`` (an interval as error bars); ``dashed``
    the same configurations' second measure (e.g. GPU-only), means only."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 5.2), dpi=120)
    styles = _styles(list(lines))
    n = len(lines)
    for i, (name, (xs, ys, lo, hi)) in enumerate(lines.items()):
        st = styles[name]
        # side by side at each x (log scale: a factor), so no interval hides another
        dodge = 2.0 ** (0.06 * (i - (n - 1) / 2))
        err = [[y - a for y, a in zip(ys, lo)], [b - y for y, b in zip(ys, hi)]]
        ax.errorbar([x * dodge for x in xs], ys, yerr=err, label=name, capsize=3,
                    marker="o", markersize=4, **st)
        if dashed and name in dashed:
            dx, dy = dashed[name]
            ax.plot([x * dodge for x in dx], dy, linestyle=":", marker="x", markersize=5,
                    color=st["color"], linewidth=1.2, alpha=0.8)
    ax.axhline(1.0, color="#222222", linewidth=1.0, linestyle="--")
    ax.set_xscale("log", base=2)
    ticks = sorted({x for xs, *_ in lines.values() for x in xs})
    ax.set_xticks(ticks, [str(int(x)) for x in ticks])
    ax.set_xlim(ticks[0] / 2 ** 0.5, ticks[-1] * 2 ** 0.5)      # room for the dodge
    ax.minorticks_off()
    ax.set_xlabel("sequences per step (prompts x M; the engine runs at most 1,024 at once)")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, loc="best", framealpha=0.9)
    ax.set_title(wrapped(title, 120), fontsize=10)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path


def wrapped(title: str, width: int) -> str:
    """``title`` with each of its lines wrapped at ``width`` characters (a long line runs
    off the figure's sides)."""
    import textwrap

    return "\n".join(part for line in title.split("\n")
                     for part in (textwrap.wrap(line, width) or [""]))
