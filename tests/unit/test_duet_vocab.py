"""DUET's token-bytes table: the join of a sample's token bytes is the text vLLM shows."""
from __future__ import annotations

import random

import pytest
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from vllm_rl.duet.vocab import token_bytes

CORPUS = ["Therefore the answer is 42.\n\n", "so \\boxed{\\frac{1}{2}}\n\n", "```python\nx = 1\n```\n",
          "<answer>12</answer> résumé naïve 数学 ok", "def f():\n    return {'a': 1}\n"] * 20


def _bytelevel():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")


def _sentencepiece():
    """Llama 2 style: Metaspace-like pieces, byte fallback, Replace/ByteFallback/Fuse/Strip."""
    tok = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>"))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"),
                                           normalizers.Replace(" ", "\u2581")])
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    bytes_ = [f"<0x{i:02X}>" for i in range(256)]
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=600, special_tokens=["<unk>", "</s>"] + bytes_))
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>", unk_token="<unk>")


@pytest.mark.parametrize("build", [_bytelevel, _sentencepiece])
def test_joined_token_bytes_are_the_decoded_text(build):
    tokenizer = build()
    table = token_bytes(tokenizer, vocab_size=len(tokenizer) + 8)
    assert len(table) == len(tokenizer) + 8 and table[-1] == b""
    rng = random.Random(0)
    for text in CORPUS[:5]:
        ids = tokenizer.encode(text, add_special_tokens=False)
        for _ in range(20):             # any window of the output, as the engine sees it
            a = rng.randrange(len(ids))
            b = rng.randrange(a, len(ids)) + 1
            prefix = tokenizer.decode(ids[:a])
            whole = tokenizer.decode(ids[:b])
            joined = b"".join(table[t] for t in ids[a:b])
            if a == 0 and build is _sentencepiece:
                joined = joined[1:] if joined.startswith(b" ") else joined   # Strip: the text's first
            assert prefix.encode() + joined == whole.encode()


def test_special_tokens_add_nothing():
    tokenizer = _bytelevel()
    table = token_bytes(tokenizer)
    assert table[tokenizer.eos_token_id] == b""
