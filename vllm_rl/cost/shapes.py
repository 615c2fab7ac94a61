"""Qwen3-style decoder shapes: the dimensions the step-cost tables were measured at, and the
parameter counts the trainer's cost model (:mod:`vllm_rl.cost.trainer`) reads from them.

Pure Python, stdlib only: :mod:`vllm_rl.cost.measure` builds its PyTorch decoder from a
:class:`Shape`, and the cost models import it without torch.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = ["SHAPES", "Shape"]


@dataclass(frozen=True)
class Shape:
    """The dimensions of a Qwen3-style decoder; ``tied``: the LM head shares the embedding
    (Qwen3-1.7B), so it is counted once in :attr:`params`."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool = False

    def __post_init__(self) -> None:
        for key, value in asdict(self).items():
            if key == "tied":
                if not isinstance(value, bool):
                    raise ValueError(f"shape tied must be a bool, got {value!r}")
            elif isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"shape {key} must be a positive int, got {value!r}")
        if self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be a multiple of "
                             f"kv_heads ({self.kv_heads})")

    @property
    def layer_params(self) -> int:
        """One layer's matmul weights: fused QKV, O, and the gated MLP (norms left out)."""
        qkv = self.hidden * (self.heads + 2 * self.kv_heads) * self.head_dim
        return qkv + self.heads * self.head_dim * self.hidden + 3 * self.hidden * self.intermediate

    @property
    def matmul_params(self) -> int:
        """The weights a token multiplies through, N in the 2N FLOPs of a forward pass per
        token: every layer and the LM head (the embedding is a lookup)."""
        return self.layers * self.layer_params + self.hidden * self.vocab

    @property
    def params(self) -> int:
        """Every parameter the optimizer updates and the sync moves: the layers, the
        embedding, and the LM head unless tied (norms left out: under 0.01%)."""
        return (self.layers * self.layer_params
                + self.hidden * self.vocab * (1 if self.tied else 2))

    @classmethod
    def from_hf_config(cls, path: str | Path) -> Shape:
        """From a Hugging Face ``config.json`` (head_dim defaults to hidden / heads)."""
        cfg = json.loads(Path(path).read_text())
        try:
            heads = cfg["num_attention_heads"]
            return cls(
                layers=cfg["num_hidden_layers"], hidden=cfg["hidden_size"], heads=heads,
                kv_heads=cfg.get("num_key_value_heads", heads),
                head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
                intermediate=cfg["intermediate_size"], vocab=cfg["vocab_size"],
                tied=bool(cfg.get("tie_word_embeddings", False)))
        except KeyError as exc:
            raise ValueError(f"{path}: config lacks {exc.args[0]!r}") from None


#: Built-in shapes (the shared H100 table's README; Qwen3-1.7B ties its embeddings).
SHAPES = {
    "qwen3-8b": Shape(layers=36, hidden=4096, heads=32, kv_heads=8, head_dim=128,
                      intermediate=12288, vocab=151936),
    "qwen3-1.7b": Shape(layers=28, hidden=2048, heads=16, kv_heads=8, head_dim=128,
                        intermediate=6144, vocab=151936, tied=True),
}
