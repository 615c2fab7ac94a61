"""The embedded model's word-level tokenizer: every word of the task is one token.

Words are marked with a leading ``▁`` (Metaspace, as in SentencePiece tokenizers) so
that vLLM's incremental detokenizer restores the spaces between them.  Only the first
word of a text (``compute`` of a prompt) is seen without the mark.
"""
from __future__ import annotations

import json
from pathlib import Path

from .problems import EOS, MAX_VALUE

MARK = "\u2581"
UNK = "<unk>"
WORDS = [str(i) for i in range(MAX_VALUE + 1)] + [
    "+", "-", "=", ";", ":", "compute", "wait", "ok", "no", "hmm", "again", "so", "\\boxed{", "}"]


PAD_TO = 64   # the model's vocabulary is padded to a multiple of this


def vocab() -> dict[str, int]:
    """Token -> id; ids the task never uses are named ``<unused_i>`` so that every id the
    model can sample decodes to something."""
    tokens = [EOS, UNK] + WORDS + [MARK + w for w in WORDS]
    size = -(-len(tokens) // PAD_TO) * PAD_TO
    tokens += [f"<unused_{i}>" for i in range(len(tokens), size)]
    return {t: i for i, t in enumerate(tokens)}


def build_tokenizer(out_dir: Path) -> None:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` (a PreTrainedTokenizerFast)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel(vocab(), unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=MARK, prepend_scheme="never")
    tok.decoder = decoders.Metaspace(replacement=MARK, prepend_scheme="never")
    tok.add_special_tokens([EOS])
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"))
    (out_dir / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "TokenizersBackend",
        "eos_token": EOS, "pad_token": EOS, "unk_token": UNK,
        "model_max_length": 1024, "clean_up_tokenization_spaces": False,
    }, indent=2) + "\n")
