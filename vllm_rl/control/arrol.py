"""ARRoL on the trainer side: the quality head, its training, the calibration, δ, voting.

ARRoL (``shared/seeds/003``) scores every rollout when it first reaches ``L_detect``
tokens with a small head on the backbone's final-norm hidden state, maps the score to a
posterior q of success (App. A.4, Eq. 1 + Bayes) and prunes it with probability 1 − p,
p = clip(κ + δ + λ(ρ − q), p_min, p_max) (Eq. 2).  The engine does the scoring and the
pruning (:mod:`vllm_rl.engine.policies.arrol`); this module is the frontend's part of
Alg. 1 (l.3, l.7-8), pure Python + PyTorch, run between steps:

- :class:`QualityHead`: the 2-layer MLP of Sec. 4.2 (hidden width 128, ReLU or GELU,
  sigmoid score) and its wire format for the engine (:meth:`QualityHead.export`,
  :meth:`QualityHead.from_state`, :func:`check_head_state`);
- :class:`HeadTrainer`: cross-entropy against the final reward on *detached* hidden
  states (Sec. 4.3 (iii): gradients stop at the backbone; Alg. 1 l.7-8);
- :class:`CalibrationBuffer`: the sliding buffer of (score, outcome) behind Eq. 1's
  counts, the prior π, and δ solved by bisection so that E[p] = κ (App. A.4,
  :func:`solve_delta`); :meth:`~CalibrationBuffer.calibration` is the ``h_t`` of
  Alg. 1 l.3, what ``vllm_rl.LLM.arrol_update(calibration=...)`` takes;
- :class:`ColdStart`: score and record but never prune for the first steps (Sec. 5:
  20 steps; App. Table 7);
- :func:`rank_weights` / :func:`weighted_vote`: test-time scaling (Sec. 4.4);
- :func:`spearman`, :func:`auc`, :func:`trace_confidence`: the measures of Fig. 2(b, c).

One step of an RL loop::

    head, cold = QualityHead(hidden_size), ColdStart(steps=20)
    trainer, buffer = HeadTrainer(head), CalibrationBuffer()
    for step in steps:
        llm.arrol_update(head=head.export(step), calibration=cold.calibration(buffer))
        ...generate with arrol={"return_hidden": True, "kappa": κ, ...}; every sample
        scored at l_detect comes back with its score s', its hidden state h and, unless
        pruned, its reward y...
        trainer.step(h_kept, y_kept); buffer.add(s_kept, y_kept); cold.tick()

(``calibration=None`` with the first update means "no calibration": the engine only
scores; pass ``cold_start=True`` to ``arrol_update`` to drop one already pushed.)
"""
from __future__ import annotations

import math
import numbers
from collections import deque
from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np
import torch

from vllm_rl.engine.policies.arrol import (BINS, TRACE_FEATURES, Calibration, bin_of, posterior,
                                           survival)

ACTIVATIONS = ("relu", "gelu")
HEAD_KEYS = ("version", "activation", "hidden_size", "width", "w1", "b1", "w2", "b2")
HEAD_FEATURE_KEYS = ("features", "w1f")      # optional: a head with trace features
HEAD_INPUTS = ("hidden", "trace", "both")
MAX_WIDTH = 4096


def _is_int(v: Any) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _check_unit(name: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or not 0.0 <= v <= 1.0:
        raise ValueError(f"{name}={v!r}: allowed a float in [0, 1]")
    return float(v)


# ------------------------------------------------------------------- the quality head


class QualityHead(torch.nn.Module):
    """s = sigmoid(w2 · act(W1 h + W1f f̂ + b1) + b2): the 2-layer MLP of Sec. 4.2 ("a 2-layer
    MLP with hidden dimension 128") on a final-norm hidden state h, optionally beside the
    sample's *trace features* f at ``l_detect`` (:data:`TRACE_FEATURES`: mean and minimum
    token log-probability and mean entropy of its first ``l_detect`` tokens, the
    DeepConf-style signals of Fig. 2a that the engine already has).  Beyond the paper: on a
    small model the hidden state at ``l_detect`` may carry little correctness signal while
    the trace does (``vllm-rl bench arrol``), so the head can read either or both.

    ``inputs``: ``"hidden"`` (the paper's head), ``"trace"`` (features only: W1 is zero)
    or ``"both"``.  Features are standardised with :attr:`feature_mean` /
    :attr:`feature_std` (set by :meth:`HeadTrainer.fit`); :meth:`export` folds the
    standardisation into W1f and b1, so the engine applies plain linear weights.
    ``fc1 = Linear(hidden_size, width)``, ``fcf = Linear(F, width, bias=False)``,
    ``fc2 = Linear(width, 1)``, ``activation`` "relu" or "gelu" (exact, not tanh).
    """

    def __init__(self, hidden_size: int, width: int = 128, activation: str = "relu",
                 inputs: str = "hidden") -> None:
        super().__init__()
        if not _is_int(hidden_size) or hidden_size < 1:
            raise ValueError(f"QualityHead hidden_size={hidden_size!r}: allowed an int >= 1")
        if not _is_int(width) or not 1 <= width <= MAX_WIDTH:
            raise ValueError(f"QualityHead width={width!r}: allowed an int in [1, {MAX_WIDTH}]")
        if activation not in ACTIVATIONS:
            raise ValueError(f"QualityHead activation={activation!r}: allowed {ACTIVATIONS}")
        if inputs not in HEAD_INPUTS:
            raise ValueError(f"QualityHead inputs={inputs!r}: allowed {HEAD_INPUTS}")
        self.activation, self.inputs = activation, inputs
        self.fc1 = torch.nn.Linear(int(hidden_size), int(width))
        self.fc2 = torch.nn.Linear(int(width), 1)
        self.fcf = None
        if inputs != "hidden":
            self.fcf = torch.nn.Linear(len(TRACE_FEATURES), int(width), bias=False)
        if inputs == "trace":
            with torch.no_grad():
                self.fc1.weight.zero_()
            self.fc1.weight.requires_grad_(False)
        self.register_buffer("feature_mean", torch.zeros(len(TRACE_FEATURES)))
        self.register_buffer("feature_std", torch.ones(len(TRACE_FEATURES)))

    @property
    def features(self) -> tuple[str, ...]:
        """The trace features the head reads (empty for a hidden-only head)."""
        return () if self.fcf is None else TRACE_FEATURES

    def forward(self, h: torch.Tensor, f: torch.Tensor | None = None) -> torch.Tensor:
        """Logits [N] (before the sigmoid) of hidden states [N, hidden_size] and, for a
        head with features, trace features [N, F] (raw; standardised here)."""
        x = self.fc1(h.float())
        if self.fcf is not None:
            if f is None:
                raise ValueError(f"QualityHead(inputs={self.inputs!r}) needs trace features")
            x = x + self.fcf((torch.as_tensor(f).float() - self.feature_mean) / self.feature_std)
        x = torch.relu(x) if self.activation == "relu" else torch.nn.functional.gelu(x)
        return self.fc2(x).squeeze(-1)

    @torch.no_grad()
    def score(self, h: torch.Tensor, f: torch.Tensor | None = None) -> torch.Tensor:
        """Scores s' = sigmoid(logit) in [0, 1], float32 [N], no gradient: what the engine
        computes at ``l_detect`` (App. A.4: the sigmoid is the normalisation to [0, 1])."""
        return torch.sigmoid(self.forward(h, f)).float()

    def export(self, version: int) -> dict[str, Any]:
        """The state the engine loads (``arrol_update(head=...)``, Alg. 1 l.4), JSON-able:
        ``version``, ``activation``, ``hidden_size``, ``width``, ``w1`` [width][hidden],
        ``b1`` [width], ``w2`` [width] (``fc2.weight[0]``), ``b2`` (float); a head with
        trace features adds ``features`` (names, in order) and ``w1f`` [width][F], with
        the feature standardisation folded in (W1f / std, b1 − W1f · mean / std)."""
        if not _is_int(version) or version < 0:
            raise ValueError(f"QualityHead.export version={version!r}: allowed an int >= 0")
        b1 = self.fc1.bias.detach().float()
        out = {"version": int(version), "activation": self.activation,
               "hidden_size": self.fc1.in_features, "width": self.fc1.out_features,
               "w1": self.fc1.weight.detach().float().tolist()}
        if self.fcf is not None:
            w1f = self.fcf.weight.detach().float() / self.feature_std
            b1 = b1 - w1f @ self.feature_mean
            out["features"] = list(TRACE_FEATURES)
            out["w1f"] = w1f.tolist()
        out.update({"b1": b1.tolist(), "w2": self.fc2.weight.detach()[0].float().tolist(),
                    "b2": float(self.fc2.bias.detach()[0])})
        return out

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> "QualityHead":
        """A head from an :meth:`export` state (``w1``/``b1``/``w2``/``b2``/``w1f`` may be
        tensors or arrays instead of lists); checked by :func:`check_head_state` first.
        A state with features comes back with ``inputs="both"`` (the folded
        standardisation stays in its weights)."""
        check_head_state(state)
        inputs = "both" if state.get("features") else "hidden"
        head = cls(int(state["hidden_size"]), int(state["width"]), state["activation"], inputs)
        with torch.no_grad():
            head.fc1.weight.copy_(_as_f32(state["w1"]))
            head.fc1.bias.copy_(_as_f32(state["b1"]))
            head.fc2.weight.copy_(_as_f32(state["w2"])[None])
            head.fc2.bias.copy_(_as_f32(state["b2"]).reshape(1))
            if head.fcf is not None:
                head.fcf.weight.copy_(_as_f32(state["w1f"]))
        return head


def _as_f32(v: Any) -> torch.Tensor:
    if isinstance(v, torch.Tensor):
        return v.detach().to("cpu", torch.float32)
    return torch.as_tensor(v, dtype=torch.float32)


def check_head_state(state: Any, hidden_size: int | None = None) -> None:
    """Raise ``ValueError`` naming the key and what is allowed unless ``state`` is a head
    the engine can load (the format of :meth:`QualityHead.export`; ``hidden_size``, when
    given, is the model's and must match).  Called by the engine on ``arrol_update``."""
    if not isinstance(state, dict):
        raise ValueError(f"head state: a mapping with keys {list(HEAD_KEYS)} "
                         f"(QualityHead.export), got {type(state).__name__}")
    missing = [k for k in HEAD_KEYS if k not in state]
    unknown = sorted(str(k) for k in state if k not in HEAD_KEYS + HEAD_FEATURE_KEYS)
    if missing or unknown:
        raise ValueError(f"head state: missing keys {missing}, unknown keys {unknown}; "
                         f"allowed keys {list(HEAD_KEYS + HEAD_FEATURE_KEYS)}")
    version, act = state["version"], state["activation"]
    if not _is_int(version) or version < 0:
        raise ValueError(f"head state 'version'={version!r}: allowed an int >= 0")
    if not isinstance(act, str) or act not in ACTIVATIONS:
        raise ValueError(f"head state 'activation'={act!r}: allowed one of {ACTIVATIONS}")
    width, hid = state["width"], state["hidden_size"]
    if not _is_int(width) or not 1 <= width <= MAX_WIDTH:
        raise ValueError(f"head state 'width'={width!r}: allowed an int in [1, {MAX_WIDTH}]")
    if not _is_int(hid) or hid < 1:
        raise ValueError(f"head state 'hidden_size'={hid!r}: allowed an int >= 1")
    if hidden_size is not None and hid != hidden_size:
        raise ValueError(f"head state 'hidden_size'={hid}: allowed only the model's "
                         f"hidden size {hidden_size}")
    shapes = {"w1": (width, hid), "b1": (width,), "w2": (width,), "b2": ()}
    feats = state.get("features")
    if ("features" in state) != ("w1f" in state):
        raise ValueError("head state: 'features' and 'w1f' go together (a head with trace "
                         "features), or neither")
    if feats is not None:
        if list(feats) != list(TRACE_FEATURES):
            raise ValueError(f"head state 'features'={feats!r}: allowed "
                             f"{list(TRACE_FEATURES)} (in this order)")
        shapes["w1f"] = (width, len(TRACE_FEATURES))
    for key, shape in shapes.items():
        try:
            t = _as_f32(state[key])
        except (TypeError, ValueError, RuntimeError) as e:
            raise ValueError(f"head state '{key}': allowed numbers of shape {shape} "
                             f"({e})") from None
        if tuple(t.shape) != shape:
            raise ValueError(f"head state '{key}': shape {tuple(t.shape)}, allowed {shape}")
        if not torch.isfinite(t).all():
            raise ValueError(f"head state '{key}': allowed finite values only")


# ------------------------------------------------------------------ training the head


def _labels(name: str, labels: Any, n: int) -> torch.Tensor:
    y = torch.as_tensor(labels).detach().to("cpu", torch.float32).reshape(-1)
    if y.numel() != n:
        raise ValueError(f"{name}: {y.numel()} values for {n} hidden states")
    if not bool(((y == 0) | (y == 1)).all()):
        raise ValueError(f"{name}: allowed values in {{0, 1}} (the binary final reward)")
    return y


class HeadTrainer:
    """On-the-fly head training (Sec. 4.3 (iii), Alg. 1 l.7-8): binary cross-entropy
    between the head's logit on the *detached* hidden state (and trace features, for a
    head that reads them) and the sample's final reward in {0, 1}; Adam (``lr`` 1e-3 by
    default).  Nothing flows back into the hidden states (stop-gradient to the backbone).
    Optional per-sample ``weights`` make the loss a weighted mean (inverse propensities of
    the labels, see :class:`vllm_rl.integrations.common.feedback.ArrolFeedback`)."""

    def __init__(self, head: QualityHead, lr: float = 1e-3, weight_decay: float = 0.0) -> None:
        if isinstance(lr, bool) or not isinstance(lr, numbers.Real) or not lr > 0:
            raise ValueError(f"HeadTrainer lr={lr!r}: allowed a float > 0")
        self.head = head
        self.opt = torch.optim.Adam([p for p in head.parameters() if p.requires_grad],
                                    lr=lr, weight_decay=weight_decay)

    def _inputs(self, hidden, features):
        x = torch.as_tensor(hidden).detach().float()       # stop-gradient to the backbone
        if x.dim() != 2 or x.shape[0] == 0:
            raise ValueError(f"hidden: allowed a non-empty [N, H] tensor, got shape "
                             f"{tuple(x.shape)}")
        f = None
        if self.head.features:
            if features is None:
                raise ValueError(f"features: the head reads {list(self.head.features)}; "
                                 "pass an [N, F] tensor")
            f = torch.as_tensor(features).detach().float()
            if tuple(f.shape) != (x.shape[0], len(self.head.features)):
                raise ValueError(f"features: shape {tuple(f.shape)}, allowed "
                                 f"({x.shape[0]}, {len(self.head.features)})")
        return x, f

    def step(self, hidden: torch.Tensor, rewards: Any, features: Any = None,
             weights: Any = None) -> float:
        """One Adam update on a batch (hidden [N, H], rewards [N] in {0, 1}, features
        [N, F] for a head with features, optional weights [N] >= 0); the loss."""
        x, f = self._inputs(hidden, features)
        y = _labels("rewards", rewards, x.shape[0])
        w = None if weights is None else torch.as_tensor(weights).detach().float().reshape(-1)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(self.head(x, f), y,
                                                                    weight=w)
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        return loss.item()

    def fit(self, hidden: torch.Tensor, rewards: Any, epochs: int = 10,
            batch_size: int = 256, generator: torch.Generator | None = None,
            features: Any = None, weights: Any = None) -> float:
        """``epochs`` shuffled passes of minibatch :meth:`step` over a buffer; the shuffles
        come from ``generator`` or torch's global RNG, so the result is deterministic given
        ``torch.manual_seed``.  A head with features first sets its standardisation to the
        buffer's feature mean and std.  Returns the mean loss of the last epoch (weighted
        by minibatch size)."""
        if not _is_int(epochs) or epochs < 1:
            raise ValueError(f"fit epochs={epochs!r}: allowed an int >= 1")
        if not _is_int(batch_size) or batch_size < 1:
            raise ValueError(f"fit batch_size={batch_size!r}: allowed an int >= 1")
        if torch.as_tensor(hidden).dim() != 2 or len(hidden) == 0:
            raise ValueError("fit: no hidden states")
        x, f = self._inputs(hidden, features)
        n = x.shape[0]
        y = _labels("rewards", rewards, n)
        w = None if weights is None else torch.as_tensor(weights).detach().float().reshape(-1)
        if w is not None and (w.numel() != n or not bool((w >= 0).all())):
            raise ValueError(f"weights: allowed {n} values >= 0")
        if f is not None:
            with torch.no_grad():
                self.head.feature_mean.copy_(f.mean(0))
                self.head.feature_std.copy_(f.std(0, unbiased=False).clamp_min(1e-3))
        total = 0.0
        for _ in range(epochs):
            order = torch.randperm(n, generator=generator)
            total = 0.0
            for i in range(0, n, batch_size):
                idx = order[i:i + batch_size]
                total += self.step(x[idx], y[idx], None if f is None else f[idx],
                                   None if w is None else w[idx]) * len(idx)
        return total / n


# ----------------------------------------------------------------- δ and the buffer


def solve_delta(qs: Sequence[float], kappa: float, rho: float, lam: float, p_min: float,
                p_max: float, tol: float = 1e-9) -> float:
    """δ with mean_i clip(κ + δ + λ(ρ − q_i), p_min, p_max) = κ, by bisection (App. A.4:
    "We solve for δ by binary search such that ... E[p_i] = κ").

    With a_i = κ + λ(ρ − q_i) the mean keep rate is continuous and non-decreasing in δ,
    from p_min at δ_lo = p_min − max a_i to p_max at δ_hi = p_max − min a_i; bisection on
    [δ_lo, δ_hi] stops when the bracket is narrower than ``tol`` (the mean is 1-Lipschitz
    in δ, so it is within ``tol``/2 of κ).  If κ is not attainable, i.e. κ > p_max (or
    κ < p_min), δ is clipped to the nearest end: δ_hi (every p = p_max) or δ_lo (every
    p = p_min).  Empty ``qs``: 0.
    """
    kappa, rho = _check_unit("kappa", kappa), _check_unit("rho", rho)
    p_min, p_max = _check_unit("p_min", p_min), _check_unit("p_max", p_max)
    if p_min > p_max:
        raise ValueError(f"p_min={p_min} > p_max={p_max}: allowed p_min <= p_max")
    if isinstance(lam, bool) or not isinstance(lam, numbers.Real) or not 0 <= lam < math.inf:
        raise ValueError(f"lam={lam!r}: allowed a finite float >= 0")
    if isinstance(tol, bool) or not isinstance(tol, numbers.Real) or not tol > 0:
        raise ValueError(f"tol={tol!r}: allowed a float > 0")
    q = np.asarray(qs, dtype=np.float64).reshape(-1)
    if q.size == 0:
        return 0.0
    if not np.isfinite(q).all():
        raise ValueError("qs: allowed finite posteriors only")
    a = kappa + lam * (rho - q)

    def mean_p(d: float) -> float:
        return float(np.clip(a + d, p_min, p_max).mean())

    lo, hi = p_min - float(a.max()), p_max - float(a.min())
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
    """The sliding buffer of scored rollouts behind the calibration (Sec. 4.2, App. A.4).

    Holds the last ``window`` (score s' in [0, 1], outcome y in {0, 1}) pairs, FIFO
    (default 2048; the paper does not give the window).  Eq. 1's counts c_b^± are
    histograms over ``bins`` uniform bins.  The prior π = P(Y = 1) is the buffer's
    positive share with the same Laplace pseudo-count α as the likelihoods, one per class:
    π = (N⁺ + α) / (N + 2α), so it is in (0, 1) even for an empty or one-class buffer
    (:attr:`prior` is the α = 1 value, (N⁺ + 1) / (N + 2)).
    """

    def __init__(self, window: int = 2048, bins: int = BINS) -> None:
        if not _is_int(window) or window < 1:
            raise ValueError(f"CalibrationBuffer window={window!r}: allowed an int >= 1")
        if not _is_int(bins) or bins < 1:
            raise ValueError(f"CalibrationBuffer bins={bins!r}: allowed an int >= 1")
        self.bins = int(bins)
        self.window = int(window)
        self.items: deque[tuple[float, int]] = deque(maxlen=self.window)

    def __len__(self) -> int:
        return len(self.items)

    def add(self, scores: Sequence[float], labels: Sequence[float]) -> None:
        """Append scored rollouts (oldest drop out past ``window``).  Scores must be
        finite (clipped into [0, 1] when binned); labels 0/1 (or False/True)."""
        scores, labels = list(scores), list(labels)
        if len(scores) != len(labels):
            raise ValueError(f"labels: {len(labels)} values for {len(scores)} scores")
        new = []
        for i, (s, y) in enumerate(zip(scores, labels)):
            s = float(s)
            if not math.isfinite(s):
                raise ValueError(f"scores[{i}]={s!r}: allowed a finite float in [0, 1]")
            if y not in (0, 1):
                raise ValueError(f"labels[{i}]={y!r}: allowed 0 or 1 (the binary reward)")
            new.append((s, int(y)))
        self.items.extend(new)

    def counts(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Eq. 1: (c^+, c^-), c_b^± = #{k in the buffer: y_k = ±, b(s_k) = b}."""
        pos, neg = [0] * self.bins, [0] * self.bins
        for s, y in self.items:
            (pos if y else neg)[bin_of(s, self.bins)] += 1
        return tuple(pos), tuple(neg)

    def smoothed_prior(self, alpha: float = 1.0) -> float:
        """π = (N⁺ + α) / (N + 2α) over the buffer."""
        n_pos = sum(y for _, y in self.items)
        return (n_pos + alpha) / (len(self.items) + 2 * alpha)

    @property
    def prior(self) -> float:
        """π with α = 1: (N⁺ + 1) / (N + 2)."""
        return self.smoothed_prior(1.0)

    def calibration(self, kappa: float = 0.5, rho: float = 0.5, lam: float = 0.5,
                    p_min: float = 0.1, p_max: float = 0.9, alpha: float = 1.0) -> Calibration:
        """The ``h_t`` of Alg. 1 l.3: Eq. 1's counts, π (:meth:`smoothed_prior` with the
        same ``alpha``), and δ = :func:`solve_delta` over the posteriors of the buffer's
        own scores, so the expected keep rate over the buffer distribution is κ (App. A.4).
        The requests' ``arrol`` flags must carry the same κ, ρ, λ, p_min, p_max.  An empty
        buffer gives δ = 0 and π = 1/2 (every q = 1/2)."""
        pos, neg = self.counts()
        prior = self.smoothed_prior(alpha)
        base = Calibration(pos, neg, alpha, prior, 0.0, self.bins)
        qs = [posterior(base, s) for s, _ in self.items]
        delta = solve_delta(qs, kappa, rho, lam, p_min, p_max)
        return Calibration(pos, neg, alpha, prior, delta, self.bins)


class ColdStart:
    """Score and record, never prune, for the first ``steps`` trainer steps (Sec. 5: "a
    cold-start period of 20 steps to initialize the quality head and the pruning
    estimator"; App. Table 7 varies it).  Call :meth:`tick` once per trainer step."""

    def __init__(self, steps: int = 20) -> None:
        if not _is_int(steps) or steps < 0:
            raise ValueError(f"ColdStart steps={steps!r}: allowed an int >= 0")
        self.steps = int(steps)
        self.done = 0

    def tick(self) -> None:
        self.done += 1

    @property
    def active(self) -> bool:
        return self.done < self.steps

    def calibration(self, source: "CalibrationBuffer | Calibration",
                    **flags: float) -> Calibration | None:
        """None while cold ("push no calibration": the engine only scores); afterwards
        ``source`` itself if it is a :class:`Calibration`, else
        ``source.calibration(**flags)`` of a :class:`CalibrationBuffer`."""
        if self.active:
            return None
        return source if isinstance(source, Calibration) else source.calibration(**flags)


# -------------------------------------------------------------------------- measures


def _ranks(x: Any) -> np.ndarray:
    """0-based ranks, ties given their average rank (multiples of 1/2, exact)."""
    a = np.asarray(x, dtype=np.float64).reshape(-1)
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


def _finite(name: str, x: Any) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64).reshape(-1)
    if not np.isfinite(a).all():
        raise ValueError(f"{name}: allowed finite numbers only")
    return a


def rank_weights(scores: Sequence[float]) -> list[float]:
    """Sec. 4.4: sort the candidates by score and rescale the ranks linearly to [0, 1]
    (lowest 0, highest 1, ties share their average rank; one candidate gets 1)."""
    s = _finite("scores", scores)
    if len(s) <= 1:
        return [1.0] * len(s)
    return (_ranks(s) / (len(s) - 1)).tolist()


def weighted_vote(answers: Sequence[Hashable], scores: Sequence[float]) -> Hashable:
    """Sec. 4.4: the answer with the largest sum of :func:`rank_weights` over its
    candidates; a tie between answers goes to the one that occurs first.  (Sums are
    compared on the unscaled average ranks, which are exact, so ties are exact.)"""
    s = _finite("scores", scores)
    if len(answers) != len(s):
        raise ValueError(f"scores: {len(s)} values for {len(answers)} answers")
    if not len(s):
        raise ValueError("weighted_vote: no candidates")
    ranks = _ranks(s) if len(s) > 1 else np.ones(1)
    totals: dict[Hashable, float] = {}
    for a, r in zip(answers, ranks):
        totals[a] = totals.get(a, 0.0) + float(r)
    best = max(totals.values())
    return next(a for a, t in totals.items() if t == best)


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rank correlation (Fig. 2(c)): Pearson's correlation of the average
    ranks (ties share their rank).  0.0 when it is undefined (fewer than 2 points or a
    constant side, e.g. a held-out set with one outcome)."""
    x, y = _finite("x", x), _finite("y", y)
    if len(x) != len(y):
        raise ValueError(f"y: {len(y)} values for {len(x)} in x")
    if len(x) < 2:
        return 0.0
    rx, ry = _ranks(x), _ranks(y)
    rx, ry = rx - rx.mean(), ry - ry.mean()
    den = math.sqrt(float((rx * rx).sum() * (ry * ry).sum()))
    return float((rx * ry).sum() / den) if den > 0 else 0.0


def auc(scores: Sequence[float], labels: Sequence[float]) -> float:
    """ROC AUC = P(score of a positive > score of a negative), a tie counted 1/2
    (Mann-Whitney U / (N⁺ N⁻) from the average ranks).  Labels are 0/1; 0.5 when one
    class is empty (undefined)."""
    s = _finite("scores", scores)
    y = np.asarray(labels, dtype=np.float64).reshape(-1)
    if len(y) != len(s):
        raise ValueError(f"labels: {len(y)} values for {len(s)} scores")
    if not np.isin(y, (0.0, 1.0)).all():
        raise ValueError("labels: allowed 0 or 1")
    pos = y == 1.0
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    if n_pos == 0 or n_neg == 0:
        return 0.5
    r = _ranks(s) + 1.0
    return float((r[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def trace_confidence(logprobs: Sequence[float]) -> float:
    """The DeepConf-style baseline of Fig. 2: mean token negative log-probability of the
    trace (lower = more confident).  Raises on an empty trace."""
    lp = _finite("logprobs", logprobs)
    if not len(lp):
        raise ValueError("trace_confidence: empty logprobs")
    return float(-lp.mean())


__all__ = ["ACTIVATIONS", "HEAD_KEYS", "HEAD_FEATURE_KEYS", "HEAD_INPUTS", "TRACE_FEATURES",
           "QualityHead", "check_head_state", "HeadTrainer",
           "solve_delta", "CalibrationBuffer", "ColdStart", "rank_weights",
           "weighted_vote", "spearman", "auc", "trace_confidence", "survival"]
