"""DAS's length-aware draft budget: how many draft tokens each request gets per step.

DAS (Shao, Srivatsa et al., Sec. 4.2) speeds up RL rollouts with speculative decoding
whose budget follows the request's expected length: the batch ends when its longest
request ends, so drafting pays on long requests and is wasted on short ones.  This
module is the policy half (pure Python, stdlib only; no vLLM, no torch); the engine's
drafter asks it for a budget every decode step.

* **Cost model** (Sec. 4.2.1).  A forward pass costs t_fwd = c_base + c_tok n_toks (Eq. 1)
  and a rollout c_base N_fwd + c_tok N_toks + C (Eq. 2).  Drafting trades fewer passes
  for more tokens per pass; on a large batch the trade stops paying:
  :func:`break_even_batch`, :func:`batch_cap`.  With a measured step-cost model in place
  of Eq. 1: :func:`cost_cap` (one draft length per step) and :func:`phase_budgets`
  (phase-aware: per request, the lengths that make the step cheapest per generated
  token; off or short in the bulk of a rollout step, the full budget in its tail).
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

import heapq
import math
import numbers
from bisect import bisect_left, insort
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from vllm_rl.control.checks import check_int as _check_int
from vllm_rl.control.checks import check_real as _check_real
from vllm_rl.control.checks import check_same_length as _check_same_length

__all__ = [
    "CLASSES", "LONG", "MEDIUM", "SHORT",
    "AcceptanceEstimate", "LengthClasses",
    "accepted_tokens", "batch_cap", "break_even_batch", "chain_acceptance", "chain_accepted",
    "cost_cap", "estimate_k", "estimate_k_alpha", "fit_alpha", "latency", "optimal_budget",
    "optimal_budgets", "phase_budgets", "phase_ms_per_token", "remaining_passes", "step_budget",
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


def _check_unit(name: str, value: Any) -> float:
    value = _check_real(name, value, lo=0.0)
    if value > 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {value}")
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


# -------------------------------------------------------- Sec. 4.2.1: batch-size cap


def batch_cap(batch_size: int, full_at: float, off_at: float) -> float:
    """The share of the draft budget kept at this batch size: 1 up to ``full_at``, 0 from
    ``off_at``, linear in between.

    Eq. 1-2: a pass costs c_base + c_tok n_toks.  On a small batch c_base dominates and
    drafting, which cuts passes (N_fwd), pays; on a large batch c_base is amortised over
    many requests while verification adds c_tok per draft token to every pass, so the
    same drafts cost more than the passes they save (see :func:`break_even_batch`).
    """
    batch_size = _check_int("batch_size", batch_size, 0)
    full_at = _check_real("full_at", full_at, lo=0.0)
    off_at = _check_real("off_at", off_at, lo=0.0)
    if off_at < full_at:
        raise ValueError(f"off_at ({off_at}) must be >= full_at ({full_at})")
    if batch_size <= full_at:
        return 1.0
    if batch_size >= off_at:
        return 0.0
    return (off_at - batch_size) / (off_at - full_at)


def chain_accepted(q: float, k: int) -> float:
    """S(q, k) = q + q² + … + q^k: the accepted tokens of a k-token draft whose tokens are
    each accepted with probability q until the first rejection."""
    q = _check_unit("q", q)
    k = _check_int("k", k, 0)
    if q >= 1.0:
        return float(k)
    return q * (1.0 - q ** k) / (1.0 - q)


def cost_cap(step_ms: Callable[[int], float], batch: int, drafting: int, q: float,
             k_max: int) -> int:
    """The draft length per request that makes a step cheapest per generated token.

    A step of ``batch`` sequences, ``drafting`` of which verify ``k`` draft tokens, costs
    ``step_ms(k)`` (the engine's step-cost model: Eq. 1's c_base + c_tok n_toks measured
    or tabulated at this batch and context) and yields ``batch + drafting · S(q, k)``
    tokens (:func:`chain_accepted`).  Returns the k in [0, k_max] minimising the cost per
    token (ties: the smaller k).  On a GPU a decode step is memory-bound: widening a
    small batch is nearly free and k = k_max; on a large batch verification costs more
    than its accepted tokens save and k = 0.  This is the batch cap of Sec. 4.2.1
    derived from the cost model instead of fixed thresholds (:func:`batch_cap`).
    """
    batch = _check_int("batch", batch, 0)
    drafting = _check_int("drafting", drafting, 0)
    k_max = _check_int("k_max", k_max, 0)
    if batch == 0 or drafting == 0 or k_max == 0:
        return 0
    best_k, best = 0, step_ms(0) / batch
    for k in range(1, k_max + 1):
        per_token = step_ms(k) / (batch + drafting * chain_accepted(q, k))
        if per_token < best * (1.0 - 1e-9):
            best_k, best = k, per_token
    return best_k


# ------------------------------------------- Sec. 4.2.1 on a step-cost model: phase-aware


def _width_curve(step_ms: Callable[[int], float], batch: int, k_top: int,
                 slopes: bool = False):
    """D ↦ the step's time when its ``batch`` sequences verify D drafts in all: ``step_ms``
    at the integer mean draft counts 0 … ``k_top`` (made non-decreasing), linear between.
    With ``slopes``, also each segment's smallest slope from it to the last (ms per
    draft), for :func:`phase_budgets`' stopping bound."""
    knots, top = [], 0.0
    for k in range(k_top + 1):
        v = step_ms(k)
        if (isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v)
                or v < 0):
            raise ValueError(f"step_ms({k}) must be a finite number >= 0, got {v!r}")
        top = max(top, float(v))
        knots.append(top)

    def cost(d: float) -> float:
        if not k_top:
            return knots[0]
        x = d / batch
        k = min(int(x), k_top - 1)
        return knots[k] + (x - k) * (knots[k + 1] - knots[k])

    if not slopes:
        return cost
    ahead = [(knots[k + 1] - knots[k]) / batch for k in range(k_top)]
    for k in range(k_top - 2, -1, -1):
        ahead[k] = min(ahead[k], ahead[k + 1])
    return cost, ahead


def _check_rows(q: Sequence[float], caps: Sequence[int], name: str = "caps"
                ) -> tuple[list[float], list[int]]:
    """``q`` in [0, 1] and ``caps`` ints >= 0, one per drafting sequence (a fast path for
    the plain floats and ints the engine passes; else each entry checked by name)."""
    qs, cs = list(q), list(caps)
    if not (all(type(v) is float and 0.0 <= v <= 1.0 for v in qs)
            and all(type(c) is int and c >= 0 for c in cs)):
        qs = [_check_unit(f"q[{i}]", v) for i, v in enumerate(qs)]
        cs = [_check_int(f"{name}[{i}]", v, 0) for i, v in enumerate(cs)]
    return qs, cs


def phase_ms_per_token(step_ms: Callable[[int], float], batch: int, q: Sequence[float],
                       k: Sequence[int]) -> float:
    """Expected time per generated token of a step in which the drafting sequences verify
    ``k[i]`` drafts each, accepted with per-token probability ``q[i]`` until the first
    rejection: step_ms at the total draft count (as :func:`phase_budgets` reads it) over
    ``batch`` + Σ_i S(q_i, k_i) (every sequence samples one token, :func:`chain_accepted`
    for the drafts).  The quantity :func:`phase_budgets` minimises."""
    batch = _check_int("batch", batch, 1)
    n = _check_same_length(q=q, k=k)
    qs, ks = _check_rows(q, k, "k")
    if n > batch:
        raise ValueError(f"q has {n} entries, more than the batch's {batch} sequences")
    cost = _width_curve(step_ms, batch, max(ks, default=0))
    tokens = batch + math.fsum(chain_accepted(a, b) for a, b in zip(qs, ks))
    return cost(sum(ks)) / tokens


def phase_budgets(step_ms: Callable[[int], float], batch: int, q: Sequence[float],
                  caps: Sequence[int]) -> list[int]:
    """Phase-aware draft lengths: per drafting sequence, the k_i in [0, caps[i]] that make
    the next step cheapest per generated token on the step-cost model.

    DAS's cost model (Sec. 4.2.1) prices a pass as t_fwd = c_base + c_tok n_toks (Eq. 1)
    and a rollout as the sum of its passes (Eq. 2); here the pass is priced by the
    engine's step-cost model instead (``step_ms(k)``: the time of the step when each of
    its ``batch`` sequences verifies k drafts, e.g. ``StepCost.uniform_ms(batch, 1 + k,
    context)``; read at k = 0 … max(caps), linear in between, so a step verifying D drafts
    in all costs step_ms at D / batch: the mean-width reading of
    :meth:`vllm_rl.cost.StepCost.step_ms`).  A draft of k tokens whose tokens are each
    accepted with probability q until the first rejection yields S(q, k) = q + … + q^k
    accepted tokens (:func:`chain_accepted`; q is Eq. 3's capacity k of the request,
    :func:`estimate_k`).  The step yields ``batch`` + Σ_i S(q_i, k_i) tokens, and this
    returns the k minimising

        step_ms(Σ_i k_i / batch) / (batch + Σ_i S(q_i, k_i))

    (ties: fewer drafts).  On a GPU that is *phase-aware* drafting: in the bulk of a
    rollout step (hundreds of sequences, a compute-bound step, widening by 8 drafts
    costs 5.3x on the H100 table at B = 256) only drafts with a high acceptance pay, and
    few of them; in the tail (a handful of sequences, a memory-bound step, +15 % at
    B = 16) every draft pays and each request drafts its full budget, which is where
    Eq. 4 says the batch's time goes (N_fwd is set by the longest requests).

    Exact: for a total of D drafts, the best split takes the D largest marginal gains
    q_i^j (j-th draft of request i; S is concave in k, so they form a prefix per request);
    the minimum over D is found by one scan of those gains in decreasing order, grouped by
    equal (q_i, caps_i) (the ratio is monotone between two evaluation points, so only the
    ends of a run of equal gains and the knots of the cost curve are evaluated), drawn
    lazily from a heap and stopped once no remaining gain can beat the best ratio: past
    D drafts the cost grows at least at the curve's smallest slope ahead, the tokens at
    most by the current gain per draft (so in the bulk only drafts whose acceptance
    beats their marginal price are looked at).
    ``q`` and ``caps`` list the drafting sequences (at most ``batch`` of them); a cap or
    acceptance of 0 gives 0.
    """
    batch = _check_int("batch", batch, 0)
    n = _check_same_length(q=q, caps=caps)
    qs, cs = _check_rows(q, caps)
    out = [0] * n
    if n > batch:
        raise ValueError(f"q has {n} entries, more than the batch's {batch} sequences")
    groups: dict[tuple[float, int], list[int]] = {}
    for i, (qv, cap) in enumerate(zip(qs, cs)):
        if qv > 0.0 and cap > 0:
            groups.setdefault((qv, cap), []).append(i)
    if not groups:
        return out
    k_top = max(cap for _, cap in groups)
    cost, slopes = _width_curve(step_ms, batch, k_top, slopes=True)
    total = sum(cap * len(members) for (_, cap), members in groups.items())
    # Marginal gains q^j in decreasing order, lazily: one run of len(members) equal units
    # per (group, j); j + 1 enters the heap only after j left it (a prefix per request).
    heap = [(-qv, qv, cap, 1) for qv, cap in groups]
    heapq.heapify(heap)
    best, best_d = cost(0) / batch, 0
    d, gained, taken = 0, 0.0, []
    while heap:
        neg_g, qv, cap, j = heapq.heappop(heap)
        g, m = -neg_g, len(groups[qv, cap])
        # Beyond d the cost grows at least at the smallest slope ahead and the tokens at
        # most by g per draft: the ratio is then monotone in the drafts added, so if it
        # cannot beat the best even after all of them, no later point can.
        rest = total - d
        if cost(d) + slopes[min(d // batch, k_top - 1)] * rest >= \
                best * (batch + gained + g * rest) * (1.0 - 1e-12):
            break
        knot = (d // batch + 1) * batch      # cost-curve knots inside the run
        while knot < d + m:
            v = cost(knot) / (batch + gained + g * (knot - d))
            if v < best * (1.0 - 1e-12):
                best, best_d = v, knot
            knot += batch
        d, gained = d + m, gained + g * m
        v = cost(d) / (batch + gained)
        if v < best * (1.0 - 1e-12):
            best, best_d = v, d
        taken.append((qv, cap, j, m))
        if j < cap:
            heapq.heappush(heap, (-(g * qv), qv, cap, j + 1))
    left = best_d
    for qv, cap, j, m in taken:
        if left <= 0:
            break
        take = min(m, left)
        for i in groups[qv, cap][:take]:
            out[i] = j
        left -= take
    return out


def break_even_batch(c_base: float, c_tok: float, accepted: float, proposed: float) -> float:
    """The batch size B* beyond which drafting stops paying (Eq. 1-2).

    Without drafting a pass over B requests costs c_base + c_tok B and advances each by
    one token; drafting p tokens per request with a accepted on average costs
    c_base + c_tok B (1 + p) and advances each by 1 + a.  Equal cost per token:
    (1 + a)(c_base + c_tok B) = c_base + c_tok B (1 + p)  ⇒  B* = c_base a / (c_tok (p − a)).
    Drafting pays for B < B*.  ``inf`` if p ≤ a (nothing wasted) or c_tok = 0; 0 if a = 0.
    """
    c_base = _check_real("c_base", c_base, lo=0.0)
    c_tok = _check_real("c_tok", c_tok, lo=0.0)
    accepted = _check_real("accepted", accepted, lo=0.0)
    proposed = _check_real("proposed", proposed, lo=0.0)
    if proposed <= accepted:
        return math.inf
    if accepted == 0.0 or c_base == 0.0:
        return 0.0
    if c_tok == 0.0:
        return math.inf
    return c_base * accepted / (c_tok * (proposed - accepted))
