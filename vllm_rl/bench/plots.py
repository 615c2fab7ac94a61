"""The pictures ``vllm-rl bench`` and ``vllm-rl serve-bench`` write beside their JSON.

- :func:`length_cdf`: the cumulative distribution of generated lengths, one line per
  configuration (the long tail the RL rollout papers start from);
- :func:`running`: requests (sequences) running over time or engine steps, one line per
  configuration (the tail of a step: a few long samples keep the batch small while
  everyone waits).

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
