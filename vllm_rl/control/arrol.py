"""ARRoL, trainer side: the quality head, its training, the calibration, δ, voting.

Paper: "ARRoL" (``shared/seeds/003``).  Pure Python + PyTorch; runs between steps.

- :class:`QualityHead`: the 2-layer MLP on a final-norm hidden state (Sec. 4.2: hidden
  width 128, ReLU or GELU, sigmoid score), and its wire format for the engine
  (:meth:`QualityHead.export`, :func:`check_head_state`);
- :class:`HeadTrainer`: cross-entropy on *detached* hidden states against the final
  reward (Sec. 4.3 (iii): no gradient reaches the backbone);
- :class:`CalibrationBuffer`: the sliding buffer of (score, outcome) behind App. A.4's
  Eq. 1 counts, the prior π, and δ solved by bisection so that E[p] = κ
  (:func:`solve_delta`); its :meth:`~CalibrationBuffer.calibration` is what
  ``vllm_rl.LLM.arrol_update(calibration=...)`` takes;
- :class:`ColdStart`: score but do not prune for the first steps (Sec. 5: 20 steps);
- :func:`weighted_vote` / :func:`rank_weights`: test-time scaling (Sec. 4.4);
- :func:`spearman`, :func:`auc`, :func:`trace_confidence`: the measures of Fig. 2c.
"""
from __future__ import annotations

import math
from collections import deque
from typing import Any, Hashable, Sequence

import numpy as np
import torch

from vllm_rl.engine.policies.arrol import BINS, Calibration, bin_of, posterior, survival

ACTIVATIONS = ("relu", "gelu")
HEAD_KEYS = ("version", "activation", "hidden_size", "width", "w1", "b1", "w2", "b2")


class QualityHead(torch.nn.Module):
    """s = sigmoid(w2 · act(W1 h + b1) + b2) on a final-norm hidden state h (Sec. 4.2)."""

    def __init__(self, hidden_size: int, width: int = 128, activation: str = "relu") -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"QualityHead activation={activation!r}: allowed {ACTIVATIONS}")
        self.activation = activation
        self.fc1 = torch.nn.Linear(hidden_size, width)
        self.fc2 = torch.nn.Linear(width, 1)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """Logits [N] (before the sigmoid)."""
        x = self.fc1(h.float())
        x = torch.relu(x) if self.activation == "relu" else torch.nn.functional.gelu(x)
        return self.fc2(x).squeeze(-1)

    @torch.no_grad()
    def score(self, h: torch.Tensor) -> torch.Tensor:
        """Scores s' in [0, 1] (float32, no gradient): what the engine computes."""
        return torch.sigmoid(self.forward(h)).float()

    def export(self, version: int) -> dict[str, Any]:
        """The state the engine loads (``arrol_update(head=...)``), JSON-able."""
        return {"version": int(version), "activation": self.activation,
                "hidden_size": self.fc1.in_features, "width": self.fc1.out_features,
                "w1": self.fc1.weight.detach().float().tolist(),
                "b1": self.fc1.bias.detach().float().tolist(),
                "w2": self.fc2.weight.detach()[0].float().tolist(),
                "b2": float(self.fc2.bias.detach()[0])}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> "QualityHead":
        check_head_state(state)
        head = cls(int(state["hidden_size"]), int(state["width"]), state["activation"])
        with torch.no_grad():
            head.fc1.weight.copy_(torch.as_tensor(state["w1"], dtype=torch.float32))
            head.fc1.bias.copy_(torch.as_tensor(state["b1"], dtype=torch.float32))
            head.fc2.weight.copy_(torch.as_tensor(state["w2"], dtype=torch.float32)[None])
            head.fc2.bias.fill_(float(torch.as_tensor(state["b2"])))
        return head


def check_head_state(state: Any, hidden_size: int | None = None) -> None:
    """Raise ``ValueError`` naming the key unless ``state`` is a head the engine can load."""
    if not isinstance(state, dict):
        raise ValueError("head state: a mapping as QualityHead.export writes it")
    missing = [k for k in HEAD_KEYS if k not in state]
    unknown = [k for k in state if k not in HEAD_KEYS]
    if missing or unknown:
        raise ValueError(f"head state: missing {missing}, unknown {unknown}; keys {HEAD_KEYS}")
    if state["activation"] not in ACTIVATIONS:
        raise ValueError(f"head state 'activation'={state['activation']!r}: allowed {ACTIVATIONS}")
    width, hid = state["width"], state["hidden_size"]
    if not isinstance(width, int) or not 1 <= width <= 4096:
        raise ValueError(f"head state 'width'={width!r}: allowed int in [1, 4096]")
    if not isinstance(hid, int) or hid < 1:
        raise ValueError(f"head state 'hidden_size'={hid!r}: allowed int >= 1")
    if hidden_size is not None and hid != hidden_size:
        raise ValueError(f"head state 'hidden_size'={hid}: the model's is {hidden_size}")
    shapes = {"w1": (width, hid), "b1": (width,), "w2": (width,), "b2": ()}
    for key, shape in shapes.items():
        try:
            t = torch.as_tensor(state[key], dtype=torch.float32)
        except (TypeError, ValueError, RuntimeError) as e:
            raise ValueError(f"head state '{key}': not numeric ({e})") from None
        if tuple(t.shape) != shape:
            raise ValueError(f"head state '{key}': shape {tuple(t.shape)}, expected {shape}")
        if not torch.isfinite(t).all():
            raise ValueError(f"head state '{key}': non-finite values")


class HeadTrainer:
    """On-the-fly head training (Sec. 4.3 (iii)): binary cross-entropy between the head's
    logit on the *detached* hidden state and the sample's final reward, Adam."""

    def __init__(self, head: QualityHead, lr: float = 1e-3, weight_decay: float = 0.0) -> None:
        self.head = head
        self.opt = torch.optim.Adam(head.parameters(), lr=lr, weight_decay=weight_decay)

    def step(self, hidden: torch.Tensor, rewards: torch.Tensor) -> float:
        """One update on a batch; returns the loss."""
        x = hidden.detach().float()                  # stop-gradient to the backbone
        y = torch.as_tensor(rewards, dtype=torch.float32).reshape(-1)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(self.head(x), y)
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        return loss.item()

    def fit(self, hidden: torch.Tensor, rewards: torch.Tensor, epochs: int = 10,
            batch_size: int = 256) -> float:
        """Shuffled minibatch epochs over a buffer (torch's global RNG); the last loss."""
        n = hidden.shape[0]
        loss = float("nan")
        for _ in range(epochs):
            order = torch.randperm(n)
            for i in range(0, n, batch_size):
                idx = order[i:i + batch_size]
                loss = self.step(hidden[idx], torch.as_tensor(rewards)[idx])
        return loss


def solve_delta(qs: Sequence[float], kappa: float, rho: float, lam: float, p_min: float,
                p_max: float, tol: float = 1e-9) -> float:
    """δ with mean_i clip(κ + δ + λ(ρ − q_i), p_min, p_max) = κ, by bisection (App. A.4).

    The mean is non-decreasing in δ; when κ lies outside [p_min, p_max] no δ reaches it
    and the δ that clips every p to the nearest end is returned.  Empty ``qs``: 0.
    """
    if not qs:
        return 0.0
    q = np.asarray(qs, dtype=np.float64)

    def mean_p(d: float) -> float:
        return float(np.clip(kappa + d + lam * (rho - q), p_min, p_max).mean())

    lo, hi = -1.0 - lam - abs(kappa), 1.0 + lam + abs(kappa)   # every p clipped low / high
    if mean_p(hi) <= kappa:
        return hi
    if mean_p(lo) >= kappa:
        return lo
    while hi - lo > tol:
        mid = 0.5 * (lo + hi)
        if mean_p(mid) < kappa:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


class CalibrationBuffer:
    """The sliding buffer of scored rollouts behind the calibration (App. A.4).

    Holds the last ``window`` (score s', outcome y) pairs.  Eq. 1's counts c_b^± are
    histograms over B uniform bins; the prior π = P(Y = 1) is the buffer's positive
    share with add-one smoothing, (Σy + 1) / (N + 2), so it stays in (0, 1).
    """

    def __init__(self, window: int = 2048, bins: int = BINS) -> None:
        self.bins = bins
        self.items: deque[tuple[float, int]] = deque(maxlen=window)

    def add(self, scores: Sequence[float], labels: Sequence[float]) -> None:
        for s, y in zip(scores, labels, strict=True):
            self.items.append((float(s), 1 if y > 0.5 else 0))

    def counts(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        pos, neg = [0] * self.bins, [0] * self.bins
        for s, y in self.items:
            (pos if y else neg)[bin_of(s, self.bins)] += 1
        return tuple(pos), tuple(neg)

    @property
    def prior(self) -> float:
        n = len(self.items)
        return (sum(y for _, y in self.items) + 1) / (n + 2)

    def calibration(self, kappa: float = 0.5, rho: float = 0.5, lam: float = 0.5,
                    p_min: float = 0.1, p_max: float = 0.9, alpha: float = 1.0) -> Calibration:
        """Eq. 1 counts, π, and δ such that the expected keep rate over the buffer is κ
        (the flags sent with the requests must carry the same κ, ρ, λ, p_min, p_max)."""
        pos, neg = self.counts()
        base = Calibration(pos, neg, alpha, self.prior, 0.0, self.bins)
        qs = [posterior(base, s) for s, _ in self.items]
        delta = solve_delta(qs, kappa, rho, lam, p_min, p_max)
        return Calibration(pos, neg, alpha, self.prior, delta, self.bins)


class ColdStart:
    """The first ``steps`` trainer steps score and record but never prune (Sec. 5: 20)."""

    def __init__(self, steps: int = 20) -> None:
        self.steps = steps
        self.done = 0

    def tick(self) -> None:
        self.done += 1

    @property
    def active(self) -> bool:
        return self.done < self.steps

    def calibration(self, buffer: CalibrationBuffer, **flags: float) -> Calibration | None:
        """None while cold (push ``arrol_update(cold_start=True)``), else the buffer's."""
        return None if self.active else buffer.calibration(**flags)


def _ranks(x: Sequence[float]) -> np.ndarray:
    """0-based ranks, ties given their average rank."""
    a = np.asarray(x, dtype=np.float64)
    order = np.argsort(a, kind="mergesort")
    ranks = np.empty(len(a))
    i = 0
    while i < len(a):
        j = i
        while j + 1 < len(a) and a[order[j + 1]] == a[order[i]]:
            j += 1
        ranks[order[i:j + 1]] = 0.5 * (i + j)
        i = j + 1
    return ranks


def rank_weights(scores: Sequence[float]) -> list[float]:
    """Sec. 4.4: ranks linearly rescaled to [0, 1] (lowest 0, highest 1; ties share the
    average rank; a single candidate gets 1)."""
    n = len(scores)
    if n == 0:
        return []
    if n == 1:
        return [1.0]
    return (_ranks(scores) / (n - 1)).tolist()


def weighted_vote(answers: Sequence[Hashable], scores: Sequence[float]) -> Hashable:
    """The answer with the largest sum of rank weights (Sec. 4.4); ties: first seen."""
    if not answers:
        raise ValueError("weighted_vote: no candidates")
    totals: dict[Hashable, float] = {}
    for a, w in zip(answers, rank_weights(scores), strict=True):
        totals[a] = totals.get(a, 0.0) + w
    best = max(totals.values())
    return next(a for a in totals if totals[a] == best)


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rank correlation (average ranks for ties); 0 if either is constant."""
    if len(x) < 2:
        return 0.0
    rx, ry = _ranks(x), _ranks(y)
    rx, ry = rx - rx.mean(), ry - ry.mean()
    den = math.sqrt(float((rx * rx).sum() * (ry * ry).sum()))
    return float((rx * ry).sum() / den) if den > 0 else 0.0


def auc(scores: Sequence[float], labels: Sequence[float]) -> float:
    """ROC AUC = P(score of a positive > score of a negative), ties counted 1/2
    (Mann-Whitney); 0.5 when one class is empty."""
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(labels) > 0.5
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    if n_pos == 0 or n_neg == 0:
        return 0.5
    r = _ranks(s) + 1.0
    return float((r[y].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def trace_confidence(logprobs: Sequence[float]) -> float:
    """DeepConf-style baseline: the mean token negative log-probability (lower = more
    confident)."""
    if not logprobs:
        return 0.0
    return float(-np.mean(np.asarray(logprobs, dtype=np.float64)))


__all__ = ["QualityHead", "check_head_state", "HeadTrainer", "solve_delta",
           "CalibrationBuffer", "ColdStart", "rank_weights", "weighted_vote", "spearman",
           "auc", "trace_confidence", "survival"]
