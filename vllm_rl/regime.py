"""A rollout regime's statistics: what decides whether DUET, DARTS, ARRoL and DAS pay.

Computed from plain per-sample facts (:class:`Sample`), so the same figures come from a
benchmark on a kit (``vllm-rl bench regime``) and from a user's own records
(``vllm-rl advise``):

* DUET (Sec. 3.2, App. A.3-A.4): the share of samples that reach the gate ``K2 + G``
  with no answer marker, ``K2`` the Kaplan-Meier p80 of the lengths (right-censored at
  the limit, :func:`vllm_rl.duet.rule.km_quantile`) and ``G`` the grace scaled to the
  limit; the tokens written after the first answer (what the tail trim removes);
* lengths: p50, p90, p99 and the share cut by the limit;
* DARTS: ρ = σ̃_L / L̃ over all lengths (App. B, Eq. 7-8: a dataset-level statistic) and,
  beside it, the mean per-prompt σ/L̄; Pattern I, the mean length of wrong samples over
  that of correct ones within a group (Sec. 3.2.2: above 1, verbosity is wasted);
* the groups: the mean correct share and the share of groups all right or all wrong;
* ARRoL (Sec. 4.2): the head's AUC at ``l_detect`` (pooled and within groups) where
  the samples carry its scores;
* DAS (Sec. 4.1): accepted tokens per draft token where the samples were drafted for.

A figure the samples cannot give (no rewards, no scores, no drafts) is None, never 0.
"""
from __future__ import annotations

import math
import re
import statistics
from dataclasses import asdict, dataclass
from typing import Iterable, Sequence

from vllm_rl.duet.markers import BOXED_PATTERN


@dataclass(frozen=True)
class Sample:
    """What one sample says about the regime.

    ``first_answer``: tokens generated when the first answer marker closed (None: no
    marker).  ``truncated``: the response limit cut it.  ``ended_early``: a technique
    ended it (DUET, DARTS, ARRoL): its natural length is unknown, so it counts only as
    right-censored at its length.  ``score``: ARRoL's head score at
    ``l_detect`` (None: not scored).  ``draft_proposed`` / ``draft_accepted``: DAS's
    counts (None: not drafted for)."""

    group: str
    length: int
    truncated: bool
    first_answer: int | None = None
    reward: float | None = None
    score: float | None = None
    draft_proposed: int | None = None
    draft_accepted: int | None = None
    ended_early: bool = False


def first_answer_tokens(token_bytes: Sequence[bytes], marker: str = BOXED_PATTERN) -> int | None:
    """How many tokens were generated when ``marker`` (a regular expression) first matched
    the output so far, or None.  ``token_bytes``: the bytes each of the sample's tokens
    adds to its text (:func:`vllm_rl.duet.vocab.token_bytes`, the table DUET's detectors
    read): the output is matched once, and the match's end mapped back to the token that
    completed it."""
    found = re.search(marker.encode(), b"".join(token_bytes))
    if found is None:
        return None
    end, seen = found.end(), 0
    for i, piece in enumerate(token_bytes):
        seen += len(piece)
        if seen >= end:
            return i + 1
    return len(token_bytes)


def quantile(values: Sequence[float], q: float) -> float:
    """The ``q``-quantile, linear between order statistics."""
    xs = sorted(values)
    pos = q * (len(xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def duet_gate(samples: Sequence[Sample], max_tokens: int) -> int:
    """``K2 + G``: K2 the Kaplan-Meier p80 of the lengths (App. A.3's online estimator,
    the truncated ones right-censored), G App. A.3's 150 tokens at 3,072 scaled to the
    limit."""
    from vllm_rl.duet.rule import km_quantile, scaled_grace

    k2 = km_quantile([(s.length, not (s.truncated or s.ended_early), 1.0) for s in samples],
                     0.80)
    return k2 + scaled_grace(max_tokens)


@dataclass(frozen=True)
class Regime:
    """The statistics of the module docstring (None where the samples cannot say)."""

    samples: int                                # ended by themselves or at the limit
    ended_early: int                            # by a technique (censored)
    groups: int
    max_tokens: int
    gate: int
    markerless_at_gate: float
    tokens_after_first_answer: float | None     # mean over samples with a marker
    share_after_first_answer: float             # of all generated tokens
    length_p50: float
    length_p90: float
    length_p99: float
    truncated: float
    rho: float                                  # DARTS's dataset-level σ̃_L / L̃
    rho_per_prompt: float                       # the mean of each group's σ / L̄
    wrong_over_right_length: float | None       # Pattern I above 1
    correct_share: float | None
    all_or_none: float | None
    head_auc: float | None
    head_auc_within: float | None
    head_accuracy: float | None                 # the score read as P(correct) at 0.5
    scored: int
    draft_acceptance: float | None              # accepted / proposed draft tokens
    draft_tokens: int

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def of(cls, samples: Iterable[Sample], max_tokens: int) -> "Regime":
        """The statistics of ``samples``.  DUET's gate and the marker-less share read all
        of them (one that reached the gate with no marker counts whatever ended it); the
        lengths, groups and head read those that ended by themselves or at the limit."""
        every = list(samples)
        xs = [s for s in every if not s.ended_early]
        if not xs:
            raise ValueError("no samples that ended by themselves or at the limit: a regime "
                             "needs at least one")
        by_group: dict[str, list[Sample]] = {}
        for s in xs:
            by_group.setdefault(s.group, []).append(s)
        lengths = [s.length for s in xs]
        gate = duet_gate(every, max_tokens)
        markerless = sum(1 for s in every if s.length >= gate
                         and (s.first_answer is None or s.first_answer > gate))
        after = [s.length - s.first_answer for s in xs if s.first_answer is not None]
        mean_len = statistics.fmean(lengths)
        spreads = [statistics.pstdev([s.length for s in g]) / statistics.fmean([s.length for s in g])
                   for g in by_group.values() if len(g) > 1 and sum(s.length for s in g) > 0]
        rewarded = [g for g in by_group.values() if all(s.reward is not None for s in g)]
        shares = [statistics.fmean(1.0 if s.reward > 0 else 0.0 for s in g) for g in rewarded]
        scored = [s for s in xs if s.score is not None and s.reward is not None]
        drafted = [s for s in xs if s.draft_proposed]
        proposed = sum(s.draft_proposed for s in drafted)
        auc, within, accuracy = _head(scored)
        return cls(
            samples=len(xs), ended_early=len(every) - len(xs), groups=len(by_group), max_tokens=max_tokens, gate=gate,
            markerless_at_gate=markerless / len(every),
            tokens_after_first_answer=statistics.fmean(after) if after else None,
            share_after_first_answer=sum(after) / max(sum(lengths), 1),
            length_p50=quantile(lengths, 0.5), length_p90=quantile(lengths, 0.9),
            length_p99=quantile(lengths, 0.99),
            truncated=statistics.fmean(s.truncated for s in xs),
            rho=statistics.pstdev(lengths) / mean_len if mean_len > 0 else 0.0,
            rho_per_prompt=statistics.fmean(spreads) if spreads else 0.0,
            wrong_over_right_length=_pattern_one(rewarded),
            correct_share=statistics.fmean(shares) if shares else None,
            all_or_none=statistics.fmean(s in (0.0, 1.0) for s in shares) if shares else None,
            head_auc=auc, head_auc_within=within, head_accuracy=accuracy, scored=len(scored),
            draft_acceptance=(sum(s.draft_accepted or 0 for s in drafted) / proposed
                              if proposed else None),
            draft_tokens=proposed)


def _pattern_one(groups: list[list[Sample]]) -> float | None:
    """The mean over mixed groups of (mean wrong length) / (mean right length)."""
    ratios = []
    for g in groups:
        right = [s.length for s in g if s.reward > 0]
        wrong = [s.length for s in g if s.reward <= 0]
        if right and wrong:
            ratios.append(statistics.fmean(wrong) / max(statistics.fmean(right), 1e-9))
    return statistics.fmean(ratios) if ratios else None


def _head(scored: list[Sample]) -> tuple[float | None, float | None, float | None]:
    """The head's pooled AUC, within-group AUC and accuracy (score > 0.5 read as right)."""
    labels = [1.0 if s.reward > 0 else 0.0 for s in scored]
    if len(set(labels)) < 2:
        return None, None, None
    from vllm_rl.arrol.measures import auc, grouped_auc

    scores = [float(s.score) for s in scored]
    within = grouped_auc(scores, [int(y) for y in labels], [1.0] * len(scored),
                         [s.group for s in scored])
    accuracy = statistics.fmean((sc > 0.5) == (y > 0) for sc, y in zip(scores, labels))
    return auc(scores, labels), within, accuracy
