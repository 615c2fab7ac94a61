"""DAS's length-aware draft budget: how many draft tokens each request gets per step.

DAS (Shao, Srivatsa et al., Sec. 4.2) speeds up RL rollouts with speculative decoding
whose budget follows the request's expected length: the batch ends when its longest
request ends, so drafting pays on long requests and is wasted on short ones.  This
module is the policy half (pure Python, stdlib only; no vLLM, no torch); the engine's
drafter asks it for a budget every decode step.

* **Cost model** (Sec. 4.2.1).  A forward pass costs t_fwd = c_base + c_tok n_toks (Eq. 1)
  and a rollout c_base N_fwd + c_tok N_toks + C (Eq. 2).  Where drafting pays by batch
  size is :mod:`.caps`.
* **Budget model** (Sec. 4.2.2).  A request of length l given p proposed tokens in all
  accepts A = k l (1 − e^{−αp/l}) of them (Eq. 3): :func:`accepted_tokens`; it still needs
  l − A passes (the term of Eq. 4): :func:`remaining_passes`; the batch's latency is
  Eq. 5: :func:`latency`.  Minimising it (Eq. 6) makes every active constraint tight and
  gives p*_i in closed form (Eq. 7): :func:`optimal_budget`, :func:`optimal_budgets`.
  :func:`step_budget` spreads a total over the passes; :func:`estimate_k_alpha` fits
  (k, α) to the counts the engine sees (:class:`AcceptanceEstimate`).
* **Length classes** (Sec. 4.2.3).  Lengths are not known in advance, so requests are
  :data:`SHORT` (no drafting), :data:`MEDIUM` (budget b) or :data:`LONG` (2b).  The
  thresholds come from the moving average of the batch's forward steps (T_short) and
  the midpoint T_med = (T_short + seq_len) / 2; a request starts in the class most of
  its problem's past rollouts fell in (Init_r) and is promoted at runtime from the
  posterior P(class | length so far, Init_r) estimated from history:
  :class:`LengthClasses`.

Typical use in the engine::

    classes = LengthClasses()
    at admission:  init = classes.initial(past_lengths_of_problem, max_tokens); cls = init
    every step:    cls = classes.update(cls, n_generated, init, max_tokens)
                   n_draft = round(classes.budget(cls, b) * batch_cap(batch_size, full, off))
    at finish:     classes.observe_final(init, final_length, max_tokens)
    end of round:  classes.observe_round(forward_steps_of_the_round)
"""
from __future__ import annotations

import math
import numbers
from bisect import bisect_left, insort
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from vllm_rl.checks import check_int as _check_int
from vllm_rl.checks import check_real as _check_real
from vllm_rl.checks import check_unit as _check_unit
from vllm_rl.checks import check_same_length as _check_same_length

__all__ = [
    "CLASSES", "LONG", "MEDIUM", "SHORT",
    "AcceptanceEstimate", "LengthClasses",
    "accepted_tokens", "chain_acceptance", "estimate_k", "estimate_k_alpha",
    "estimate_k_many", "fit_alpha",
    "latency", "optimal_budget", "optimal_budgets", "remaining_passes", "step_budget",
]

SHORT, MEDIUM, LONG = "short", "medium", "long"
CLASSES = (SHORT, MEDIUM, LONG)          # shortest first; index = rank
_RANK = {c: i for i, c in enumerate(CLASSES)}

K_MIN, K_MAX = 0.01, 0.99                # clamps of estimate_k_alpha
ALPHA_MIN, ALPHA_MAX = 0.05, 20.0


# ------------------------------------------------------------------------ input checks


def _check_class(name: str, value: Any) -> str:
    if value not in _RANK:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, CLASSES))}, "
                         f"got {value!r}")
    return value


def _check_model(p: Any, l: Any, k: Any, alpha: Any) -> tuple[float, float, float, float]:
    return (_check_real("p", p, lo=0.0), _check_real("l", l, lo=0.0), _check_unit("k", k),
            _check_real("alpha", alpha, lo=0.0, strict=True))


# ----------------------------------------------------------- Sec. 4.2.3: length classes


@dataclass
class LengthClasses:
    """The length-class policy of Sec. 4.2.3: thresholds, Init_r, runtime promotion.

    **Thresholds.**  T_short is the moving average of the forward steps of the last
    ``horizon`` rounds (a round is one rollout batch; its forward steps are the length
    of the batch's longest request, the N_fwd of Eq. 4, so "short" means l ≤ N_fwd,
    the requests Eq. 7 gives p* = 0).  It is clamped to [1, max_tokens]; before the
    first round it is max_tokens / 2 (our choice: the paper gives no cold start; the
    midpoint puts T_med at ¾ max_tokens, so the three classes split [0, max_tokens]
    as ½ / ¼ / ¼, and with no history every request starts MEDIUM anyway).
    T_med = (T_short + max_tokens) / 2.  A length l is short if l < T_short, medium
    if l < T_med, else long.

    **History.**  The last ``history`` final lengths, each with its Init_r and its
    max_tokens.  Classes are not stored: a history entry (L, M) is classified with the
    *current* thresholds at its own M, so a new T_short applies to all of history at
    once.  Lengths are kept sorted per (Init_r, max_tokens) and per max_tokens, so
    :meth:`posterior` is a handful of bisections per distinct max_tokens (normally one):
    O(log n), whatever the thresholds do.

    **Promotion** (:meth:`update`): short → medium once P(short | l, Init_r) <
    ``promote_short`` (0.4), medium → long once P(long | l, Init_r) > ``promote_long``
    (0.6), the paper's values; never a demotion.  ``min_support`` is how many history
    entries with Init_r and final length ≥ l the posterior needs before it conditions on
    Init_r (below that it pools all of history).

    ``horizon`` and ``history`` are read at construction.
    """

    horizon: int = 16
    history: int = 4096
    promote_short: float = 0.4
    promote_long: float = 0.6
    min_support: int = 8
    _rounds: deque = field(init=False, repr=False, compare=False)
    _round_sum: int = field(init=False, repr=False, compare=False, default=0)
    _entries: deque = field(init=False, repr=False, compare=False)
    _by_init: dict = field(init=False, repr=False, compare=False)   # init -> M -> sorted L
    _by_max: dict = field(init=False, repr=False, compare=False)    # M -> sorted L

    def __post_init__(self) -> None:
        self.horizon = _check_int("horizon", self.horizon, 1)
        self.history = _check_int("history", self.history, 1)
        self.promote_short = _check_unit("promote_short", self.promote_short)
        self.promote_long = _check_unit("promote_long", self.promote_long)
        self.min_support = _check_int("min_support", self.min_support, 1)
        self._rounds = deque(maxlen=self.horizon)
        self._round_sum = 0
        self._entries = deque()
        self._by_init = {c: {} for c in CLASSES}
        self._by_max = {}

    def __len__(self) -> int:
        """How many final lengths the history holds."""
        return len(self._entries)

    # ------------------------------------------------------------------ thresholds

    def observe_round(self, forward_steps: int) -> None:
        """A round ended after ``forward_steps`` forward passes (N_fwd, Eq. 4); T_short
        averages the last ``horizon`` of them (Sec. 4.2.3)."""
        forward_steps = _check_int("forward_steps", forward_steps, 0)
        if len(self._rounds) == self.horizon:
            self._round_sum -= self._rounds[0]
        self._rounds.append(forward_steps)
        self._round_sum += forward_steps

    def t_short(self, max_tokens: int) -> float:
        """T_short (Sec. 4.2.3): the moving average of the rounds' forward steps, clamped
        to [1, max_tokens]; max_tokens / 2 before the first round."""
        max_tokens = _check_int("max_tokens", max_tokens, 1)
        return self._t_short(max_tokens)

    def _t_short(self, max_tokens: int) -> float:
        if not self._rounds:
            return max_tokens / 2.0
        return min(max(self._round_sum / len(self._rounds), 1.0), float(max_tokens))

    def t_med(self, max_tokens: int) -> float:
        """T_med = (T_short + seq_len) / 2 (Sec. 4.2.3), seq_len = max_tokens."""
        max_tokens = _check_int("max_tokens", max_tokens, 1)
        return (self._t_short(max_tokens) + max_tokens) / 2.0

    def classify(self, length: int, max_tokens: int) -> str:
        """The class of a (final) length (Sec. 4.2.3): short below T_short, medium below
        T_med, else long."""
        length = _check_int("length", length, 0)
        max_tokens = _check_int("max_tokens", max_tokens, 1)
        return self._classify(length, max_tokens)

    def _classify(self, length: int, max_tokens: int) -> str:
        t_short = self._t_short(max_tokens)
        if length < t_short:
            return SHORT
        return MEDIUM if length < (t_short + max_tokens) / 2.0 else LONG

    # ------------------------------------------------------------------ history

    def observe_final(self, init_class: str, length: int, max_tokens: int) -> None:
        """Record a finished request: its Init_r, final length and max_tokens (the
        "historical rollout statistics" P(c | l, Init_r) is estimated from, Sec. 4.2.3).
        The oldest entry drops out beyond ``history``."""
        init_class = _check_class("init_class", init_class)
        length = _check_int("length", length, 0)
        max_tokens = _check_int("max_tokens", max_tokens, 1)
        if len(self._entries) == self.history:
            self._forget(*self._entries.popleft())
        self._entries.append((init_class, length, max_tokens))
        insort(self._by_init[init_class].setdefault(max_tokens, []), length)
        insort(self._by_max.setdefault(max_tokens, []), length)

    def _forget(self, init_class: str, length: int, max_tokens: int) -> None:
        for groups in (self._by_init[init_class], self._by_max):
            lengths = groups[max_tokens]
            del lengths[bisect_left(lengths, length)]
            if not lengths:
                del groups[max_tokens]

    def initial(self, problem_lengths: Sequence[int], max_tokens: int) -> str:
        """Init_r = argmax_c #{r' ~ r : r' ∈ c} (Sec. 4.2.3, item 2): the class most of the
        problem's past final lengths fall in under the current thresholds.  Ties go to
        the longer class; no past lengths: :data:`MEDIUM`."""
        max_tokens = _check_int("max_tokens", max_tokens, 1)
        counts = [0, 0, 0]
        for i, length in enumerate(problem_lengths):
            length = _check_int(f"problem_lengths[{i}]", length, 0)
            counts[_RANK[self._classify(length, max_tokens)]] += 1
        if not any(counts):
            return MEDIUM
        best = max(counts)
        return CLASSES[max(i for i, n in enumerate(counts) if n == best)]

    # ------------------------------------------------------------------ posterior

    def posteriors(self, length: int, init: str, max_tokens: int) -> tuple[float, float, float]:
        """(P(short | l, Init_r), P(medium | l, Init_r), P(long | l, Init_r)) of Sec. 4.2.3,
        as :meth:`posterior` defines them; they sum to 1."""
        length = _check_int("length", length, 0)
        init = _check_class("init", init)
        max_tokens = _check_int("max_tokens", max_tokens, 1)
        return self._posteriors(length, init, max_tokens)

    def _posteriors(self, length: int, init: str, max_tokens: int) -> tuple[float, float, float]:
        counts = self._counts(self._by_init[init], length)
        if sum(counts) < self.min_support:
            counts = self._counts(self._by_max, length)
        total = sum(counts)
        if total == 0:                   # longer than anything seen: the class of l itself
            rank = _RANK[self._classify(length, max_tokens)]
            return tuple(1.0 if i == rank else 0.0 for i in range(3))   # type: ignore
        return counts[0] / total, counts[1] / total, counts[2] / total

    def _counts(self, groups: dict, length: int) -> tuple[int, int, int]:
        """#{entries with final length ≥ ``length``} per class, by bisection per max_tokens."""
        short = medium = long = 0
        for max_tokens, lengths in groups.items():
            t_short = self._t_short(max_tokens)
            i_len = bisect_left(lengths, length)
            i_short = max(bisect_left(lengths, t_short), i_len)
            i_med = max(bisect_left(lengths, (t_short + max_tokens) / 2.0), i_short)
            short += i_short - i_len
            medium += i_med - i_short
            long += len(lengths) - i_med
        return short, medium, long

    def posterior(self, cls: str, length: int, init: str, max_tokens: int) -> float:
        """P(cls | l, Init_r) of Sec. 4.2.3 ("Class_r | l, Init_r = argmax_c P(c | l, Init_r)").

        Estimated from history as P(class = cls | final length ≥ l, Init_r): among the
        entries with Init_r = ``init`` and final length ≥ ``length``, the share in class
        ``cls`` (current thresholds, each entry at its own max_tokens).  With fewer than
        ``min_support`` such entries, all entries with final length ≥ ``length`` regardless
        of Init_r.  With none at all (a request longer than anything seen), 1 if
        ``length`` itself is in class ``cls`` at ``max_tokens``, else 0.
        """
        cls = _check_class("cls", cls)
        return self.posteriors(length, init, max_tokens)[_RANK[cls]]

    def update(self, current: str, length: int, init: str, max_tokens: int) -> str:
        """Runtime update of Sec. 4.2.3: short → medium once P(short | l) < promote_short,
        then medium → long once P(long | l) > promote_long (so one call can take short to
        long); never a demotion.  Call it each step with the tokens generated so far."""
        current = _check_class("current", current)
        if current == LONG:
            return LONG
        length = _check_int("length", length, 0)
        init = _check_class("init", init)
        max_tokens = _check_int("max_tokens", max_tokens, 1)
        p_short, _, p_long = self._posteriors(length, init, max_tokens)
        if current == SHORT and p_short < self.promote_short:
            current = MEDIUM
        if current == MEDIUM and p_long > self.promote_long:
            current = LONG
        return current

    def budget(self, cls: str, b: int) -> int:
        """The class's draft budget (Sec. 4.2.3): short 0, medium ``b``, long ``2b`` (a long
        request must accept up to seq_len − T_short tokens, a medium one half that)."""
        cls = _check_class("cls", cls)
        b = _check_int("b", b, 0)
        return _RANK[cls] * b


# ------------------------------------------------------ Sec. 4.2.2: the budget model


def accepted_tokens(p: float, l: float, k: float, alpha: float) -> float:
    """Eq. 3: A(p) = k l (1 − e^{−αp/l}), the accepted tokens of a request of length ``l``
    given ``p`` proposed tokens in all (0 for l = 0)."""
    p, l, k, alpha = _check_model(p, l, k, alpha)
    return 0.0 if l == 0.0 else -k * l * math.expm1(-alpha * p / l)


def remaining_passes(p: float, l: float, k: float, alpha: float) -> float:
    """l − A(p) = l (1 − k + k e^{−αp/l}), the forward passes one request needs: the term
    maximised in Eq. 4 (N_fwd = max_i of it)."""
    p, l, k, alpha = _check_model(p, l, k, alpha)
    return 0.0 if l == 0.0 else l * (1.0 - k + k * math.exp(-alpha * p / l))


def latency(p_list: Sequence[float], l_list: Sequence[float], k_list: Sequence[float],
            alpha_list: Sequence[float], c_base: float, c_tok: float, c: float = 0.0) -> float:
    """Eq. 5: J(p) = c_base max_i l_i (1 − k_i + k_i e^{−α_i p_i / l_i}) + c_tok Σ_i p_i + C
    (an empty batch costs C)."""
    _check_same_length(p_list=p_list, l_list=l_list, k_list=k_list, alpha_list=alpha_list)
    c_base = _check_real("c_base", c_base, lo=0.0)
    c_tok = _check_real("c_tok", c_tok, lo=0.0)
    c = _check_real("c", c, lo=0.0)
    passes = [remaining_passes(*args) for args in zip(p_list, l_list, k_list, alpha_list)]
    return c_base * max(passes, default=0.0) + c_tok * math.fsum(p_list) + c


def _eq7(l: float, k: float, alpha: float, n_fwd: float) -> float:
    """Eq. 7 without checks: −(l/α) ln(1 − (1 − N/l)/k); 0 if N ≥ l, inf if N ≤ l(1 − k)."""
    if n_fwd >= l:
        return 0.0
    x = (1.0 - n_fwd / l) / k if k > 0.0 else math.inf
    return math.inf if x >= 1.0 else -(l / alpha) * math.log1p(-x)


def optimal_budget(l: float, k: float, alpha: float, n_fwd: float,
                   p_max: float | None = None) -> float:
    """Eq. 7: p*_i = −(l_i/α_i) ln(1 − (1 − N_fwd/l_i)/k_i) for N_fwd < l_i, else 0.

    The budget that makes Eq. 6's constraint tight, l (1 − k + k e^{−αp/l}) = N_fwd.  When
    N_fwd ≤ l (1 − k) no finite budget reaches N_fwd (a request cannot accept more than
    k l tokens): ``inf``, or ``p_max`` if given (every result is capped at ``p_max``).
    """
    l = _check_real("l", l, lo=0.0)
    k = _check_unit("k", k)
    alpha = _check_real("alpha", alpha, lo=0.0, strict=True)
    n_fwd = _check_real("n_fwd", n_fwd, lo=0.0)
    p = _eq7(l, k, alpha, n_fwd)
    return p if p_max is None else min(p, _check_real("p_max", p_max, lo=0.0))


def optimal_budgets(l_list: Sequence[float], k_list: Sequence[float],
                    alpha_list: Sequence[float], c_base: float, c_tok: float,
                    p_max: float | None = None) -> tuple[float, list[float]]:
    """Eq. 6 solved: (N*_fwd, [p*_i]) minimising c_base N_fwd + c_tok Σ_i p_i subject to
    l_i (1 − k_i + k_i e^{−α_i p_i / l_i}) ≤ N_fwd, 0 ≤ p_i (≤ ``p_max`` if given).

    For a given N the cheapest p_i is Eq. 7's p_i(N) (tight constraint, 0 once N ≥ l_i),
    so Eq. 6 is the one-dimensional problem min_N J(N) = c_base N + c_tok Σ_i p_i(N).

    * Range: N ≤ max_i l_i (beyond it J only grows) and N ≥ each request's floor: l_i
      (1 − k_i) exclusive (p_i → ∞ there), or remaining_passes(p_max) inclusive with a
      cap, or l_i itself when k_i = 0 (no drafting gain: p_i = 0).
    * Convexity: on N < l_i, dp_i/dN = −1 / (α_i (k_i − 1 + N/l_i)), negative and
      increasing; at N = l_i it jumps up to 0.  So dJ/dN = c_base − c_tok Σ_{l_i > N}
      1 / (α_i (k_i − 1 + N/l_i)) is non-decreasing, J is convex, and N* is where dJ/dN
      changes sign, found by bisection (to a relative 1e-13, or float resolution).
      If dJ/dN < 0 up to max_i l_i, N* = max_i l_i and nobody drafts (drafting the
      longest request costs more tokens than the passes it saves, c_tok > c_base α k);
      if dJ/dN ≥ 0 at a capped floor, N* is that floor.

    Returns (0.0, []) for an empty batch; requests with l_i = 0 or k_i = 0 get 0.
    """
    n = _check_same_length(l_list=l_list, k_list=k_list, alpha_list=alpha_list)
    ls = [_check_real(f"l_list[{i}]", v, lo=0.0) for i, v in enumerate(l_list)]
    ks = [_check_unit(f"k_list[{i}]", v) for i, v in enumerate(k_list)]
    alphas = [_check_real(f"alpha_list[{i}]", v, lo=0.0, strict=True)
              for i, v in enumerate(alpha_list)]
    c_base = _check_real("c_base", c_base, lo=0.0)
    c_tok = _check_real("c_tok", c_tok, lo=0.0, strict=True)
    if p_max is not None:
        p_max = _check_real("p_max", p_max, lo=0.0)
    if n == 0:
        return 0.0, []
    top = max(ls)

    # Floors: the largest closed one (reachable) and the largest open one (p -> inf).
    closed = 0.0
    open_ = -math.inf
    terms = []                                   # (l_i, α_i, k_i − 1) of drafting requests
    for l, k, alpha in zip(ls, ks, alphas):
        if l == 0.0:
            continue
        if k == 0.0:
            closed = max(closed, l)
            continue
        terms.append((l, alpha, k - 1.0))
        if p_max is None:
            open_ = max(open_, l * (1.0 - k))
        else:
            closed = max(closed, l * (1.0 - k + k * math.exp(-alpha * p_max / l)))

    def slope(N: float) -> float:               # right derivative dJ/dN
        return c_base - c_tok * math.fsum(1.0 / (a * (km1 + N / l))
                                          for l, a, km1 in terms if l > N)

    if open_ >= closed:
        lo = open_                               # slope(lo+) = −inf
    else:
        lo = closed
        if lo >= top or slope(lo) >= 0.0:
            return _result(lo, ls, ks, alphas, p_max)
    hi = top
    while hi - lo > 1e-13 * hi:
        mid = 0.5 * (lo + hi)
        if not lo < mid < hi:
            break
        if slope(mid) < 0.0:
            lo = mid
        else:
            hi = mid
    return _result(hi, ls, ks, alphas, p_max)


def _result(n_fwd: float, ls: list[float], ks: list[float], alphas: list[float],
            p_max: float | None) -> tuple[float, list[float]]:
    budgets = [_eq7(l, k, a, n_fwd) if l > 0.0 and k > 0.0 else 0.0
               for l, k, a in zip(ls, ks, alphas)]
    if p_max is not None:
        budgets = [min(p, p_max) for p in budgets]
    return n_fwd, budgets


def step_budget(p_total: float, n_fwd: float, cap: int) -> int:
    """Eq. 7's total spread over the passes: min(cap, round(p*_i / N_fwd)), rounding
    half up.

    Our reading: Eq. 3 counts the tokens proposed over a whole generation, which takes
    N_fwd passes at the optimum (every active constraint of Eq. 6 is tight), and one
    verification round proposes at most ``cap`` tokens, so an even spread is
    p*_i / N_fwd per pass.  ``p_total`` may be ``inf`` (gives ``cap``); ``n_fwd`` ≤ 0
    gives ``cap`` for a positive total.
    """
    if (isinstance(p_total, bool) or not isinstance(p_total, numbers.Real)
            or math.isnan(p_total) or p_total < 0):
        raise ValueError(f"p_total must be a number >= 0 (inf allowed), got {p_total!r}")
    p_total = float(p_total)
    n_fwd = _check_real("n_fwd", n_fwd)
    cap = _check_int("cap", cap, 0)
    if p_total == 0.0:
        return 0
    if n_fwd <= 0.0 or math.isinf(p_total):
        return cap
    return min(cap, math.floor(p_total / n_fwd + 0.5))


# -------------------------------------------------- fitting (k, α) to the engine's counts


@dataclass
class AcceptanceEstimate:
    """Running counts for :func:`estimate_k_alpha`: draft tokens ``proposed``, of them
    ``accepted``, and tokens ``generated`` (accepted + one sampled token per
    verification step) over the steps observed."""

    proposed: int = 0
    accepted: int = 0
    generated: int = 0

    def observe(self, proposed: int, accepted: int, generated: int) -> None:
        """Add one step's (or one request's) counts."""
        proposed = _check_int("proposed", proposed, 0)
        accepted = _check_int("accepted", accepted, 0)
        generated = _check_int("generated", generated, 0)
        if accepted > proposed or accepted > generated:
            raise ValueError(f"accepted ({accepted}) must not exceed proposed ({proposed}) "
                             f"or generated ({generated})")
        self.proposed += proposed
        self.accepted += accepted
        self.generated += generated


def chain_acceptance(proposed: float, accepted: float, generated: float) -> float | None:
    """The per-draft-token acceptance probability q of a geometric acceptance chain,
    matched to the counts (the k of Eq. 3, see :func:`estimate_k_alpha`).

    Each verification step emits its accepted drafts plus one sampled token, so the
    counts cover R = generated − accepted steps with γ = proposed / R drafts and
    a = accepted / R accepted on average.  A chain that accepts each draft with
    probability q until the first rejection accepts S(q, γ) = q + q² + … + q^γ =
    q (1 − q^γ) / (1 − q) per step; S increases in q from 0 to γ, and q solves
    S(q, γ) = a (bisection).  For γ = 1 this is q = accepted / proposed.  1.0 if every
    draft was accepted; ``None`` with no draft or no step.
    """
    if proposed <= 0 or generated - accepted <= 0:
        return None
    if accepted <= 0:
        return 0.0
    if accepted >= proposed:
        return 1.0
    rounds = generated - accepted
    gamma, target = proposed / rounds, accepted / rounds
    lo, hi = 0.0, 1.0
    for _ in range(100):
        q = 0.5 * (lo + hi)
        if not lo < q < hi:
            break
        # S(q, γ) = q (1 − q^γ) / (1 − q), q^γ as exp(γ ln q) for any real γ > 0
        if -q * math.expm1(gamma * math.log(q)) / (1.0 - q) < target:
            lo = q
        else:
            hi = q
    return 0.5 * (lo + hi)


def fit_alpha(proposed: float, accepted: float, generated: float, k: float) -> float | None:
    """α such that Eq. 3 passes through the counts with capacity k:
    A = k l (1 − e^{−αP/l})  ⇔  α = −(l/P) ln(1 − A/(k l)), for P > 0 and 0 < A < k l
    (else ``None``: the counts say nothing about α, or need more than k l accepted)."""
    if proposed <= 0 or accepted <= 0 or k <= 0 or accepted >= k * generated:
        return None
    return -(generated / proposed) * math.log1p(-accepted / (k * generated))


def estimate_k(est: AcceptanceEstimate, prior_k: float = 0.5,
               prior_weight: float = 16.0) -> float:
    """Eq. 3's k fitted to the engine's counts: the k half of :func:`estimate_k_alpha`.

    q̂ = :func:`chain_acceptance` of the counts (the per-draft-token acceptance of a
    geometric chain, which is Eq. 3's capacity k), shrunk toward ``prior_k`` by
    ``prior_weight`` pseudo draft tokens: k = (q̂ P + prior_k w) / (P + w); ``prior_k``
    with no draft yet.  Clamped to [0.01, 0.99].
    """
    prior_k = _check_unit("prior_k", prior_k)
    prior_weight = _check_real("prior_weight", prior_weight, lo=0.0)
    P = est.proposed
    q = chain_acceptance(P, est.accepted, est.generated)
    k = prior_k if q is None else (q * P + prior_k * prior_weight) / (P + prior_weight)
    return min(max(k, K_MIN), K_MAX)


def estimate_k_many(proposed, accepted, generated, prior_k, prior_weight: float = 16.0):
    """:func:`estimate_k` for many count triples at once (numpy arrays; ``prior_k`` an
    array or a number): the same k per entry, the bisection of :func:`chain_acceptance`
    run on all entries together (each entry stops where the scalar one does), so a
    drafter step costs ~100 vector operations, not a Python bisection per request.
    Returns a float64 array."""
    import numpy as np

    P = np.asarray(proposed, dtype=np.float64)
    A = np.asarray(accepted, dtype=np.float64)
    G = np.asarray(generated, dtype=np.float64)
    prior = np.broadcast_to(np.asarray(prior_k, dtype=np.float64), P.shape)
    q = np.full(P.shape, np.nan)
    ok = (P > 0) & (G - A > 0)
    q[ok & (A <= 0)] = 0.0
    q[ok & (A > 0) & (A >= P)] = 1.0
    mid = np.flatnonzero(ok & (A > 0) & (A < P))
    if len(mid):
        rounds = G[mid] - A[mid]
        gamma, target = P[mid] / rounds, A[mid] / rounds
        lo, hi = np.zeros(len(mid)), np.ones(len(mid))
        run = np.ones(len(mid), dtype=bool)
        with np.errstate(divide="ignore", invalid="ignore"):
            for _ in range(100):
                x = 0.5 * (lo + hi)
                run &= (lo < x) & (x < hi)
                if not run.any():
                    break
                below = -x * np.expm1(gamma * np.log(x)) / (1.0 - x) < target
                lo = np.where(run & below, x, lo)
                hi = np.where(run & ~below, x, hi)
        q[mid] = 0.5 * (lo + hi)
    k = np.where(np.isnan(q), prior, (np.nan_to_num(q) * P + prior * prior_weight)
                 / (P + prior_weight))
    return np.clip(k, K_MIN, K_MAX)


def estimate_k_alpha(est: AcceptanceEstimate, prior_k: float = 0.5, prior_alpha: float = 1.0,
                     prior_weight: float = 16.0) -> tuple[float, float]:
    """(k, α) of Eq. 3 fitted to the engine's counts (P = proposed, A = accepted,
    l = generated).

    **k.**  Eq. 3's k is the capacity lim_{p→∞} A/l.  Under a geometric acceptance
    chain (each draft accepted with probability q until the first rejection) a step
    with budget γ emits S = q (1 − q^γ)/(1 − q) accepted tokens plus one, so the
    accepted share of generated tokens is S / (S + 1) → q as γ → ∞: k = q.  q is what
    :func:`chain_acceptance` recovers from the counts, and the prior enters as
    ``prior_weight`` pseudo draft tokens at rate ``prior_k``:
    k = (q̂ P + prior_k w) / (P + w).  For one draft per step q̂ = A / P and this is
    (A + prior_k w) / (P + w); with longer drafts A / P would understate q (the drafts
    after the first rejection are never tested), hence the inversion.
    Clamped to [0.01, 0.99].

    **α.**  With k fixed, Eq. 3 through (P, A, l) gives α = −(l/P) ln(1 − A/(k l)) when
    P > 0 and 0 < A < k l (:func:`fit_alpha`), else ``prior_alpha``.  Clamped to
    [0.05, 20].  With no data at all the result is (prior_k, prior_alpha), clamped.
    """
    prior_alpha = _check_real("prior_alpha", prior_alpha, lo=0.0, strict=True)
    k = estimate_k(est, prior_k, prior_weight)
    alpha = fit_alpha(est.proposed, est.accepted, est.generated, k)
    alpha = prior_alpha if alpha is None else alpha
    return k, min(max(alpha, ALPHA_MIN), ALPHA_MAX)
