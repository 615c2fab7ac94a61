"""ARRoL's quality head on the trainer side: the module, its wire format, its training.

ARRoL (arXiv:2603.24840) scores every rollout when it first reaches ``L_detect``
tokens with a small head on the backbone's final-norm hidden state, maps the score to a
posterior q of success (App. A.4, Eq. 1 + Bayes) and prunes it with probability 1 − p,
p = clip(κ + δ + λ(ρ − q), p_min, p_max) (Eq. 2).  The engine scores and prunes
(:mod:`.rule`, :mod:`.scorer`); this module is the frontend's head (Alg. 1 l.7-8):

- :class:`QualityHead`: the 2-layer MLP of Sec. 4.2 (hidden width 128, ReLU or GELU,
  sigmoid score), optionally reading the trace features, and its wire format for the
  engine (:meth:`QualityHead.export`, :meth:`QualityHead.from_state`,
  :func:`check_head_state`);
- :class:`HeadTrainer`: cross-entropy against the final reward on *detached* hidden
  states (Sec. 4.3 (iii): gradients stop at the backbone; Alg. 1 l.7-8).

The calibration is :mod:`.calibration`, the feedback loop that runs both between steps
:class:`.controller.ArrolFeedback`.
"""
from __future__ import annotations

import numbers
from typing import Any

import torch

from vllm_rl.checks import is_int as _is_int
from vllm_rl.arrol.rule import (TRACE_FEATURES)

ACTIVATIONS = ("relu", "gelu")
HEAD_KEYS = ("version", "activation", "hidden_size", "width", "w1", "b1", "w2", "b2")
HEAD_FEATURE_KEYS = ("features", "w1f")      # optional: a head with trace features
HEAD_INPUTS = ("hidden", "trace", "both")
MAX_WIDTH = 4096


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
    the labels, see :class:`vllm_rl.arrol.controller.ArrolFeedback`)."""

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








# -------------------------------------------------------------------------- measures
















__all__ = ["ACTIVATIONS", "HEAD_KEYS", "HEAD_FEATURE_KEYS", "HEAD_INPUTS", "TRACE_FEATURES",
           "QualityHead", "check_head_state", "HeadTrainer"]
