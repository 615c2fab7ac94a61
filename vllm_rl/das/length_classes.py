"""DAS's length classes (Sec. 4.2.3): a request's expected length, as a class.

Lengths are not known in advance, so requests are :data:`SHORT` (no drafting),
:data:`MEDIUM` (budget b) or :data:`LONG` (2b).  The thresholds come from the moving
average of the batch's forward steps (T_short) and the midpoint T_med = (T_short +
seq_len) / 2; a request starts in the class most of its problem's past rollouts fell in
(Init_r) and is promoted at runtime from the posterior P(class | length so far, Init_r)
estimated from history: :class:`LengthClasses`.  The budget each class gets is
:mod:`.budget_model`'s.  Pure Python, stdlib only.

Typical use in the engine::

    classes = LengthClasses()
    at admission:  init = classes.initial(past_lengths_of_problem, max_tokens); cls = init
    every step:    cls = classes.update(cls, n_generated, init, max_tokens)
                   n_draft = round(classes.budget(cls, b) * batch_cap(batch_size, full, off))
    at finish:     classes.observe_final(init, final_length, max_tokens)
    end of round:  classes.observe_round(forward_steps_of_the_round)
"""
from __future__ import annotations

from bisect import bisect_left, insort
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from vllm_rl.checks import check_int as _check_int
from vllm_rl.checks import check_unit as _check_unit

__all__ = ["CLASSES", "LONG", "MEDIUM", "SHORT", "LengthClasses"]

SHORT, MEDIUM, LONG = "short", "medium", "long"
CLASSES = (SHORT, MEDIUM, LONG)          # shortest first; index = rank
_RANK = {c: i for i, c in enumerate(CLASSES)}


def _check_class(name: str, value: Any) -> str:
    if value not in _RANK:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, CLASSES))}, "
                         f"got {value!r}")
    return value




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
