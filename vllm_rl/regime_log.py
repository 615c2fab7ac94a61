"""The regime log: each step's samples as the facts ``vllm-rl advise`` reads.

A drop-in given a path (TRL: ``RolloutFunc(regime_log=...)``) appends one JSON line per
sample after each step, off the engine's path (the trainer's side, once the rewards are
in): the :class:`vllm_rl.regime.Sample` fields, the step and the response limit.  Only
a sample carried to the next step waits for its end; one that a technique ended early
is marked so (``ended_early``: censored at its length).  The
first answer's position is counted in tokens over the bytes each token adds to the text
(the table DUET's detectors read), never by decoding.  :func:`read` reads a log back and
says clearly what is wrong with one it cannot use.
"""
from __future__ import annotations

import json
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any, Sequence

from vllm_rl.regime import Sample, first_answer_tokens
from vllm_rl.duet.markers import BOXED_PATTERN
from vllm_rl.outcome import Reason

REQUIRED = ("group", "length", "truncated", "max_tokens")


class RecordsError(ValueError):
    """A log ``vllm-rl advise`` cannot read: the message says what and where."""


class RegimeLog:
    """Appends each step's samples to ``path`` (JSON lines)."""

    def __init__(self, path: str | Path, tokenizer: Any, max_tokens: int,
                 marker: str = BOXED_PATTERN, vocab_size: int = 0) -> None:
        from vllm_rl.duet.vocab import token_bytes

        self.path, self.max_tokens, self.marker = Path(path), int(max_tokens), marker
        self.table = token_bytes(tokenizer, vocab_size)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def sample(self, group: str, token_ids: Sequence[int], info,
               reward: float | None) -> Sample | None:
        """One sample's facts from all its tokens and its record (:class:`~vllm_rl.outcome.
        RolloutInfo`); None for one carried to the next step or dropped as stale."""
        if info.reason in (Reason.CARRIED, Reason.STALE):
            return None
        table = self.table
        return Sample(
            group=group, length=len(token_ids), truncated=info.reason == Reason.LENGTH,
            first_answer=first_answer_tokens(
                [table[t] if t < len(table) else b"" for t in token_ids], self.marker),
            reward=reward, score=info.score, draft_proposed=info.draft_proposed,
            draft_accepted=info.draft_accepted, ended_early=not info.reason.natural)

    def write(self, step: int, samples: Sequence[Sample]) -> None:
        append(self.path, step, samples, self.max_tokens)


def append(path: str | Path, step: int, samples: Sequence[Sample], max_tokens: int) -> None:
    """Append ``samples`` of ``step`` to the log at ``path``."""
    with Path(path).open("a") as f:
        for s in samples:
            f.write(json.dumps({"step": step, "max_tokens": max_tokens, **asdict(s)}) + "\n")


def read(path: str | Path, last_steps: int | None = None) -> tuple[list[Sample], int]:
    """The samples of a regime log (of its ``last_steps`` steps) and its response limit."""
    path = Path(path)
    if not path.is_file():
        raise RecordsError(f"{path}: no such file")
    names = {f.name for f in fields(Sample)}
    rows: list[tuple[int, Sample]] = []
    limits: set[int] = set()
    with path.open() as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise RecordsError(f"{path}:{number}: not JSON ({e.msg})") from None
            if not isinstance(row, dict):
                raise RecordsError(f"{path}:{number}: a record is a JSON object")
            missing = [k for k in REQUIRED if k not in row]
            if missing:
                raise RecordsError(f"{path}:{number}: missing {', '.join(missing)}")
            try:
                sample = Sample(**{k: v for k, v in row.items() if k in names})
                _check(sample)
                limits.add(int(row["max_tokens"]))
                rows.append((int(row.get("step", 0)), sample))
            except (TypeError, ValueError) as e:
                raise RecordsError(f"{path}:{number}: {e}") from None
    if not rows:
        raise RecordsError(f"{path}: no records (write a few steps with a drop-in's "
                           "regime_log first)")
    if len(limits) > 1:
        raise RecordsError(f"{path}: records of several response limits {sorted(limits)}: "
                           "advise reads one regime at a time")
    if last_steps is not None:
        keep = sorted({step for step, _ in rows})[-last_steps:]
        rows = [(step, s) for step, s in rows if step in keep]
    return [s for _, s in rows], limits.pop()


def _check(s: Sample) -> None:
    if not isinstance(s.group, str) or not s.group:
        raise ValueError("group: a non-empty string")
    if not isinstance(s.length, int) or s.length < 0:
        raise ValueError(f"length {s.length!r}: an int >= 0")
    for name in ("truncated", "ended_early"):
        if not isinstance(getattr(s, name), bool):
            raise ValueError(f"{name} {getattr(s, name)!r}: true or false")
    if s.first_answer is not None and (not isinstance(s.first_answer, int)
                                       or not 0 < s.first_answer <= s.length):
        raise ValueError(f"first_answer {s.first_answer!r}: an int in [1, length] or null")
    for name in ("reward", "score"):
        v = getattr(s, name)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise ValueError(f"{name} {v!r}: a number or null")
