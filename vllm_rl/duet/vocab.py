"""Token id -> the bytes it adds to the text: what DUET's markers read instead of text.

DUET's detectors look for ASCII structure (a closed ``\\boxed{...}``, a fence line, an
answer tag).  The engine core never decodes a sample to find them: it reads the
vocabulary once (as vLLM's structured-output backends do in the same process) into a
table of each token's bytes, and a poll joins the bytes of the tokens generated since
the last one (:mod:`vllm_rl.duet.markers`).  The join of a sample's token bytes is the
UTF-8 text vLLM's detokenizer shows, where the tokenizer's decoder is one of:

* ``ByteLevel`` (GPT-2, Qwen, Llama 3): each token string maps back to its bytes;
* ``Metaspace`` (SentencePiece style): ``▁`` is a space;
* a ``Sequence`` of ``Replace(▁, " ")``, ``ByteFallback``, ``Fuse`` and ``Strip``
  (Llama 2, Mistral): ``▁`` is a space, ``<0xNN>`` the byte NN.  ``Strip`` removes the
  first space of a whole text only, never inside a sample's output.

Special tokens add nothing (vLLM skips them: ``skip_special_tokens``).  For any other
decoder each token is decoded on its own, once, here: exact for the ASCII markers
unless the decoder joins tokens with spaces of its own (WordPiece's ``##``); the
engine logs which way the table was built.
"""
from __future__ import annotations

import json
import logging
import re
from typing import Any

logger = logging.getLogger(__name__)

_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-to-unicode map, inverted (the ByteLevel pre-tokenizer's alphabet)."""
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
          + list(range(ord("®"), ord("ÿ") + 1)))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def _decoder_kind(tokenizer: Any) -> tuple[str, str]:
    """(kind, Metaspace replacement) of a fast tokenizer's decoder; ("", "") if unknown."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return "", ""
    try:
        dec = json.loads(backend.to_str()).get("decoder") or {}
    except Exception:                                   # noqa: BLE001 (any tokenizer)
        return "", ""
    kind = dec.get("type", "")
    if kind == "ByteLevel":
        return "bytelevel", ""
    if kind == "Metaspace":
        return "metaspace", dec.get("replacement", "\u2581")
    if kind == "Sequence":
        parts = {d.get("type") for d in dec.get("decoders", [])}
        replace = [d for d in dec.get("decoders", []) if d.get("type") == "Replace"]
        if parts <= {"Replace", "ByteFallback", "Fuse", "Strip"} and replace:
            pattern = replace[0].get("pattern", {}).get("String", "\u2581")
            return "sentencepiece", pattern
        if "ByteLevel" in parts and parts <= {"ByteLevel", "Replace", "Strip", "Fuse"}:
            return "bytelevel", ""
    return "", ""


def token_bytes(tokenizer: Any, vocab_size: int = 0) -> list[bytes]:
    """The table: ``table[token_id]`` is the bytes the token adds to a sample's text
    (``b""`` for special tokens and ids past the tokenizer's vocabulary, up to
    ``vocab_size``, the model's possibly padded vocabulary)."""
    n = len(tokenizer)
    size = max(n, vocab_size)
    pieces = tokenizer.convert_ids_to_tokens(list(range(n)))
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    for t in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items():
        if getattr(t[1], "special", False):
            special.add(t[0])
    kind, mark = _decoder_kind(tokenizer)
    table: list[bytes] = [b""] * size
    if kind == "bytelevel":
        dec = _byte_decoder()
        for i, p in enumerate(pieces):
            if i in special or p is None:
                continue
            try:
                table[i] = bytes(dec[c] for c in p)
            except KeyError:                 # an added, non-byte-level token
                table[i] = p.encode("utf-8")
    elif kind in ("metaspace", "sentencepiece"):
        for i, p in enumerate(pieces):
            if i in special or p is None:
                continue
            m = _BYTE_TOKEN.fullmatch(p) if kind == "sentencepiece" else None
            table[i] = bytes([int(m.group(1), 16)]) if m else p.replace(mark, " ").encode()
    else:
        for i in range(n):
            if i not in special:
                table[i] = tokenizer.decode([i], skip_special_tokens=True).encode("utf-8")
    logger.info("DUET marker table: %d token ids (%s decoder)", size, kind or "per-token")
    return table


__all__ = ["token_bytes"]
