"""DUET's answer-marker detectors (App. A.3, "Marker Patterns").

Each detector reads decoded text (the last 256 tokens of a sample) and says whether a
*complete* answer span is there, so that the verifier's reading of the sample can no
longer change (DUET assumption A3):

* math: a closed, nested-brace ``\\boxed{...}`` followed by a blank line or by a colon
  that ends its line;
* code: a closing fence at column zero, at least as long as the prompt's opening fence;
* short QA: ``<answer>...</answer>``, or "Therefore the answer is X" ended by a full stop
  or a line break;
* user patterns: an RE2 regular expression (linear-time matching, size-limited).

All detectors are single passes over the text; none can stall the engine.
"""
from __future__ import annotations

import re
from typing import Callable

from vllm_rl.flags import compile_user_pattern


Detector = Callable[[str], bool]

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
    if pattern is not None:
        return compile_user_pattern(pattern)
    if kind == "math":
        return math_marker
    if kind == "code":
        return code_marker(opening_fence(prompt))
    return qa_marker


__all__ = ["Detector", "code_marker", "detector", "math_marker", "opening_fence", "qa_marker"]
