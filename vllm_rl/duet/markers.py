"""DUET's answer-marker detectors (App. A.3, "Marker Patterns").

Each detector says whether a sample's output holds a *complete* answer span, so that
the verifier's reading of the sample can no longer change (DUET assumption A3):

* math: a closed, nested-brace ``\\boxed{...}`` followed by a blank line or by a colon
  that ends its line;
* code: a closing fence at column zero, at least as long as the prompt's opening fence;
* short QA: ``<answer>...</answer>``, or "Therefore the answer is X" ended by a full stop
  or a line break;
* user patterns: an RE2 regular expression (linear-time matching, size-limited).

The functions over text (:func:`math_marker`, :func:`code_marker`, :func:`qa_marker`)
define what fires.  The engine runs their incremental forms (:class:`MathMarker`,
:class:`CodeMarker`, :class:`QAMarker`): a poll hands them the bytes of the tokens
generated since the last poll (:mod:`vllm_rl.duet.vocab`; no decoding, no tokenizer) and
they resume where they stopped, so each byte of a sample is scanned once, by C-level
searches, and a poll answers exactly what the text function would answer on the whole
output so far.  A user pattern (RE2, linear-time, size-limited) is the exception: it
reads the last :data:`PATTERN_WINDOW` tokens at each poll, as in the paper.
"""
from __future__ import annotations

import abc
import re
from typing import Callable

from vllm_rl.flags import compile_user_pattern


Detector = Callable[[str], bool]
PATTERN_WINDOW = 256     # tokens a user pattern reads at a poll (App. A.3)
# A closed ``\boxed{...}`` with nothing required after it, as a user pattern: the kits'
# answer (their completions end "\boxed{ N }" and EOS, with no blank line after the box,
# so the built-in math marker would never fire on them) and ``vllm-rl advise``'s default.
BOXED_PATTERN = r"\\boxed\{[^}]*\}"

_BOX = "\\boxed{"
_QA = re.compile(r"<answer>.*?</answer>|Therefore the answer is [^.\n]+[.\n]", re.DOTALL)
_FENCE = re.compile(r"^(`{3,})", re.MULTILINE)


def math_marker(text: str) -> bool:
    """A closed ``\\boxed{...}`` (braces balanced) followed by a blank line or ``:`` + EOL."""
    start = text.find(_BOX)
    while start != -1:
        end = _close(text, start + len(_BOX))
        if end is not None and _terminated(text, end):
            return True
        start = text.find(_BOX, start + 1)
    return False


def _close(text: str, i: int) -> int | None:
    """Index just past the brace closing the one opened before ``i``, or None."""
    depth = 1
    while i < len(text):
        c = text[i]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return None


def _terminated(text: str, i: int) -> bool:
    """After the box: a blank line, or the rest of the line ends with a colon."""
    eol = text.find("\n", i)
    if eol == -1:
        return False                     # the line is not finished yet
    line = text[i:eol]
    if line.rstrip().endswith(":"):
        return True
    nxt = text.find("\n", eol + 1)
    blank = text[eol + 1: nxt if nxt != -1 else len(text)]
    return line.strip() == "" and nxt != -1 and blank.strip() == ""


def code_marker(fence: str = "```") -> Detector:
    """A line that is a closing fence (at column zero, at least as long as ``fence``)."""
    n = len(fence)

    def detect(text: str) -> bool:
        for m in _FENCE.finditer(text):
            line_end = text.find("\n", m.end())
            if line_end == -1:
                continue                 # the fence line is not finished yet
            if len(m.group(1)) >= n and text[m.end():line_end].strip() == "":
                return True
        return False

    return detect


def qa_marker(text: str) -> bool:
    return _QA.search(text) is not None


def opening_fence(prompt: str) -> str:
    """The last opening code fence of a prompt (its backticks), default three."""
    fences = _FENCE.findall(prompt)
    return fences[-1] if fences else "```"


def detector(kind: str, pattern: str | None, prompt: str = "") -> Detector:
    """The text function of a marker kind (the definition the incremental forms keep)."""
    if pattern is not None:
        return compile_user_pattern(pattern)
    if kind == "math":
        return math_marker
    if kind == "code":
        return code_marker(opening_fence(prompt))
    return qa_marker


# ---------------------------------------------------------------------------------------
# Incremental forms, over the bytes of the tokens (what the engine polls)
# ---------------------------------------------------------------------------------------
class Marker(abc.ABC):
    """A detector over one sample's output tokens, polled by the engine."""

    @abc.abstractmethod
    def poll(self, table: list[bytes], tokens) -> bool:
        """Whether the marker has fired in ``tokens`` (the sample's output token ids so
        far; ``table``: token id -> bytes)."""

    def prime(self, table: list[bytes], prior) -> bool:
        """A continuation (partial rollouts): the sample's tokens from earlier steps,
        which precede ``tokens`` in every later :meth:`poll`; whether the marker fired in
        them.  A detector that reads a window of the latest tokens reads only the
        continuation's."""
        return False


class ByteMarker(Marker):
    """An incremental detector: :meth:`poll` feeds the tokens generated since the last
    poll, as bytes from the table, to :meth:`feed`, which scans only what it has not
    seen (keeping the few bytes an unfinished span still needs)."""

    def __init__(self) -> None:
        self.fed = 0                       # output tokens fed so far
        self.buf = bytearray()             # the bytes a pending span may still need

    def poll(self, table: list[bytes], tokens) -> bool:
        new = tokens[self.fed:]
        self.fed += len(new)
        return self.feed(b"".join([table[t] for t in new]))

    def prime(self, table: list[bytes], prior) -> bool:
        return self.feed(b"".join([table[t] for t in prior]))   # fed stays 0: ``tokens``
                                                                 # are the continuation's

    @abc.abstractmethod
    def feed(self, data: bytes) -> bool:
        """Scan ``data`` (the bytes that follow what was fed before); whether the marker
        has fired."""

    def _trim(self, keep: int) -> None:
        """Forget ``buf[:keep]`` (amortised: only once it is worth a move)."""
        if keep > 4096 or keep > len(self.buf) // 2 > 0:
            del self.buf[:keep]
            self._shifted(keep)

    def _shifted(self, n: int) -> None:
        """``n`` bytes left the front of :attr:`buf`: move any positions kept into it."""


_BRACE = re.compile(rb"[{}]")
_BOX_B = _BOX.encode()


class MathMarker(ByteMarker):
    """:func:`math_marker`, incrementally.  Each ``\\boxed{``'s closing brace is its
    ``{``'s match in ordinary bracket matching (depth counted from the box, as
    :func:`_close`), found with one stack of open braces; a closed box waits for the
    end of its line (and, if that is blank, of the next) and then fires or is dropped
    (:func:`_terminated`).  Unmatched braces cost one stack slot each."""

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[bool] = []        # open braces: is it a box's?
        self.closed: list[int] = []        # buf offsets just past a closed box's brace

    def feed(self, data: bytes) -> bool:
        buf = self.buf
        start = len(buf)
        buf += data
        stack, closed = self.stack, self.closed
        for m in _BRACE.finditer(buf, start):
            i = m.start()
            if buf[i] == 0x7B:                                   # "{"
                stack.append(i >= 6 and buf[i - 6:i + 1] == _BOX_B)
            elif stack and stack.pop():                          # "}" closing a box
                closed.append(i + 1)
        fired = False
        if closed:
            pending = []
            for end in closed:
                verdict = _terminated_bytes(buf, end)
                if verdict is None:
                    pending.append(end)
                elif verdict:
                    fired = True
            self.closed = pending
        self._trim(min(self.closed + [max(0, len(buf) - 6)]))
        return fired

    def _shifted(self, n: int) -> None:
        self.closed = [e - n for e in self.closed]


def _terminated_bytes(buf: bytearray, i: int) -> bool | None:
    """:func:`_terminated` on bytes, or None while the lines it reads are unfinished."""
    eol = buf.find(b"\n", i)
    if eol == -1:
        return None
    line = buf[i:eol].decode("utf-8", "replace")
    if line.rstrip().endswith(":"):
        return True
    if line.strip() != "":
        return False
    nxt = buf.find(b"\n", eol + 1)
    if nxt == -1:
        return None
    return buf[eol + 1:nxt].decode("utf-8", "replace").strip() == ""


class CodeMarker(ByteMarker):
    """:func:`code_marker`, incrementally: each finished line is checked once."""

    def __init__(self, fence: str = "```") -> None:
        super().__init__()
        self.n = len(fence)

    def feed(self, data: bytes) -> bool:
        self.buf += data
        if b"\n" not in data:
            return False
        *lines, rest = self.buf.split(b"\n")
        self.buf = bytearray(rest)
        return any(line[:3] == b"```" and _fence_line(line.decode("utf-8", "replace"), self.n)
                   for line in lines)


def _fence_line(line: str, n: int) -> bool:
    m = _FENCE.match(line)
    return m is not None and len(m.group(1)) >= n and line[m.end():].strip() == ""


_OPEN, _CLOSE = b"<answer>", b"</answer>"
_THEREFORE = b"Therefore the answer is "
_SENTENCE_END = re.compile(rb"[.\n]")


class QAMarker(ByteMarker):
    """:func:`qa_marker`, incrementally: ``<answer>`` then ``</answer>``, or the phrase
    followed by at least one character other than ``.``/newline and then one of them."""

    def __init__(self) -> None:
        super().__init__()
        self.opened = False
        self.phrases: list[int] = []       # buf offsets just past a pending phrase
        self.scanned = 0                   # buf offset searched up to

    def feed(self, data: bytes) -> bool:
        buf = self.buf
        buf += data
        if not self.opened:
            i = buf.find(_OPEN, max(0, self.scanned - len(_OPEN) + 1))
            if i != -1:
                self.opened = True
                close_from = i + len(_OPEN)
        else:
            close_from = max(0, self.scanned - len(_CLOSE) + 1)
        if self.opened and buf.find(_CLOSE, close_from) != -1:
            return True
        i = buf.find(_THEREFORE, max(0, self.scanned - len(_THEREFORE) + 1))
        while i != -1:
            self.phrases.append(i + len(_THEREFORE))
            i = buf.find(_THEREFORE, i + 1)
        pending = []
        for q in self.phrases:
            if q >= len(buf):
                pending.append(q)
            elif buf[q] not in b".\n":
                if _SENTENCE_END.search(buf, max(q + 1, self.scanned)) is not None:
                    return True
                pending.append(q)
        self.phrases = pending
        self.scanned = len(buf)
        keep = len(buf) - max(len(_OPEN), len(_CLOSE), len(_THEREFORE))
        self._trim(max(0, min(pending + [keep])))
        return False

    def _shifted(self, n: int) -> None:
        self.phrases = [q - n for q in self.phrases]
        self.scanned -= n


class PatternMarker(Marker):
    """A user pattern (RE2) over the last :data:`PATTERN_WINDOW` tokens at each poll."""

    def __init__(self, pattern: str) -> None:
        self.match = compile_user_pattern(pattern)

    def poll(self, table: list[bytes], tokens) -> bool:
        tail = tokens[-PATTERN_WINDOW:]
        return self.match(b"".join([table[t] for t in tail]).decode("utf-8", "replace"))


def marker(kind: str, pattern: str | None, prompt_fence: str = "```") -> Marker:
    """A fresh incremental detector for one sample (``prompt_fence``: the opening fence
    of its prompt, for ``code``: :func:`opening_fence`)."""
    if pattern is not None:
        return PatternMarker(pattern)
    if kind == "math":
        return MathMarker()
    if kind == "code":
        return CodeMarker(prompt_fence)
    return QAMarker()


__all__ = ["PATTERN_WINDOW", "ByteMarker", "CodeMarker", "Detector", "Marker", "MathMarker", "PatternMarker",
           "QAMarker", "code_marker", "detector", "marker", "math_marker", "opening_fence",
           "qa_marker"]
