"""The regime as a running server's ``/metrics`` shows it (``vllm-rl advise --metrics``).

The front end counts every flagged sample once, at its end (:mod:`vllm_rl.metrics`), so
``/metrics`` holds what the records hold, summed: no per-sample rows, no rewards.  From it:

* the lengths of the samples that ended by themselves or at the limit, from the
  ``vllm_rl:sample_length`` histogram: each quantile as the bucket it falls in
  (``(lo, hi]``: a histogram cannot say more), the mean exactly;
* the share cut by the limit: ``samples_ended{reason="length"}`` over the natural ends;
* DUET's marker-less share at its gate, as the engine measures it
  (:mod:`vllm_rl.duet.regime_gate`), and whether the last DUET sample's gate was open;
* ARRoL's head: its held-out within-group AUC as the trainer's last calibration gave it;
* DAS: accepted draft tokens per draft token, exactly.

What ``/metrics`` cannot give (no sample was flagged for the technique yet: the gauges
are NaN; the correct shares, which need rewards) is None.  The regime log
(:mod:`vllm_rl.regime_log`) gives all of it.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from vllm_rl.metrics import NAMESPACE, total
from vllm_rl.outcome import Reason

LENGTH = NAMESPACE + "sample_length"


@dataclass(frozen=True)
class ServedRegime:
    """The statistics of the module docstring (None where ``/metrics`` cannot say)."""

    samples: int                                      # natural ends (histogram count)
    ended_early: int                                  # by a technique
    length_mean: float | None
    length_p50: tuple[float, float] | None            # the bucket (lo, hi] it falls in
    length_p90: tuple[float, float] | None
    length_p99: tuple[float, float] | None
    truncated: float | None
    markerless_at_gate: float | None
    duet_gate_open: bool | None
    head_auc_within: float | None
    arrol_gate_open: bool | None
    draft_acceptance: float | None
    draft_tokens: int

    def as_dict(self) -> dict:
        """As JSON can hold it: a bucket open to the right ends in None, not infinity."""
        out = asdict(self)
        for key, value in out.items():
            if isinstance(value, tuple):
                out[key] = [value[0], None if math.isinf(value[1]) else value[1]]
        return out

    @classmethod
    def of(cls, flat: dict[str, float]) -> "ServedRegime":
        """From :func:`vllm_rl.metrics.parse` (a ``/metrics`` page) or
        :func:`vllm_rl.metrics.snapshot` (in process)."""
        ended = "vllm_rl:samples_ended_total"
        natural = sum(total(flat, ended, reason=r.value) for r in Reason if r.natural)
        early = sum(total(flat, ended, reason=r.value) for r in Reason if r.early)
        count = total(flat, LENGTH + "_count")
        buckets = sorted((float(_le(key)), value) for key, value in flat.items()
                         if key.startswith(LENGTH + "_bucket{"))
        proposed = total(flat, "vllm_rl:draft_tokens_proposed_total")
        accepted = total(flat, "vllm_rl:draft_tokens_accepted_total")
        return cls(
            samples=int(count), ended_early=int(early),
            length_mean=total(flat, LENGTH + "_sum") / count if count else None,
            length_p50=bucket_of(buckets, 0.50), length_p90=bucket_of(buckets, 0.90),
            length_p99=bucket_of(buckets, 0.99),
            truncated=(total(flat, ended, reason=Reason.LENGTH.value) / natural
                       if natural else None),
            markerless_at_gate=_gauge(flat, "duet_markerless_share"),
            duet_gate_open=_flag(_gauge(flat, "duet_gate_open")),
            head_auc_within=_gauge(flat, "arrol_head_auc"),
            arrol_gate_open=_flag(_gauge(flat, "arrol_gate_open")),
            draft_acceptance=accepted / proposed if proposed else None,
            draft_tokens=int(proposed))


def bucket_of(buckets: list[tuple[float, float]], q: float) -> tuple[float, float] | None:
    """The bucket ``(lo, hi]`` of a cumulative histogram (``[(le, count), ...]``, sorted)
    that holds the ``q``-quantile, or None for an empty one."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank, lo = q * buckets[-1][1], 0.0
    for le, cumulative in buckets:
        if cumulative >= rank:
            return (lo, le)
        lo = le
    return (lo, math.inf)


def _le(key: str) -> str:
    return key.split('le="', 1)[1].split('"', 1)[0]


def _gauge(flat: dict[str, float], name: str) -> float | None:
    value = flat.get(NAMESPACE + name)
    return None if value is None or math.isnan(value) else value


def _flag(value: float | None) -> bool | None:
    return None if value is None else value > 0.5


__all__ = ["ServedRegime", "bucket_of"]
