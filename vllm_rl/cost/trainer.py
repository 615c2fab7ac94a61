"""The trainer's time for one RL step, projected on the GPU and model shape the rollout is
priced on, and the two accountings of a step's end-to-end time.

A step trains on a batch of ``rows`` sequences (:class:`TrainedBatch`): each a prompt and
a completion, padded as the trainer pads them (TRL: every prompt to the batch's longest,
left, and every completion to the longest, right; verl's ``use_remove_padding``: packed, no
pad).  Its time (:class:`TrainerCost`, :meth:`TrainerCost.step`) is

* the log-prob pass, one forward over the batch: ``2 N T + a(T)`` FLOPs,
* the forward and backward passes: ``6 N T + 3 a(T)``, and ``2 N T + a(T)`` more for the
  forward recomputed under gradient checkpointing (TRL's GRPO default),

at ``mfu`` of the GPUs' dense bf16 peak over ``trainer_gpus`` (Kaplan et al.'s 6N per
trained token; N = :attr:`~vllm_rl.cost.shapes.Shape.matmul_params`, T the batch's
tokens as padded, a(T) = 2 · 2 · layers · heads · head_dim · Σ s²/2 the causal attention
of sequences of length s);

* the optimizer step: AdamW reads and writes ``optimizer_bytes`` per parameter (fp32
  master, gradient, both moments, the bf16 copy), at ``hbm_efficiency`` of the memory
  bandwidth, sharded over the trainer's GPUs;
* the weight sync: the bf16 weights, 2 bytes a parameter, at the topology's sync
  bandwidth (a device copy where trainer and engine share the GPU, NCCL over NVLink where
  they do not), plus a fixed ``sync_overhead_s`` (the engine's reload and cache reset).

Until a GPU has measured them (``python -m vllm_rl.cost.measure_trainer``, which writes
the measured passes for :meth:`TrainerCost.load`), the constants are the ones named in
:data:`MODEL` and :data:`GPUS`, declared here once.

Two accountings of a step (:func:`end_to_end`), each named in every figure:

* ``colocated``: rollout + trainer + sync, one after the other (TRL's colocated mode,
  verl's synchronous trainer);
* ``overlap``: max(rollout, trainer) + sync, the next step's rollout running while the
  trainer trains this one (a disaggregated one-step-off-policy trainer).

Pure Python, stdlib only.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from vllm_rl.checks import check_int, check_real
from vllm_rl.cost.shapes import SHAPES, Shape

__all__ = ["ACCOUNTINGS", "GPUS", "GPU", "MODEL", "TOPOLOGIES", "Topology", "TrainedBatch",
           "TrainerConstants", "TrainerCost", "TrainerTime", "end_to_end", "topology"]


@dataclass(frozen=True)
class GPU:
    """A GPU's dense bf16 peak (TFLOP/s) and memory bandwidth (TB/s), as its maker states."""

    name: str
    peak_tflops: float
    hbm_tbps: float


#: The GPUs a topology can name.  H100 SXM5: 989 TFLOP/s dense bf16, 3.35 TB/s HBM3.
GPUS = {"h100": GPU("H100 SXM", 989.0, 3.35)}


@dataclass(frozen=True)
class TrainerConstants:
    """The modelled trainer's constants, in one place (:data:`MODEL`).

    ``mfu``: model FLOPs utilisation of the training passes (40%: what a tuned FSDP or
    DeepSpeed trainer reaches on an H100 at these sizes; the step-cost table's own prefill
    runs at about 45% on the 1.7B shape); ``logprob_passes``: forward passes before the
    update (1: verl's old-log-prob pass, TRL's with vLLM's importance-sampling
    correction); ``optimizer_bytes``: bytes AdamW moves per parameter (fp32 param read and
    written 8, fp32 gradient 4, two moments read and written 16, the bf16 copy written 2);
    ``hbm_efficiency``: the share of the memory bandwidth a streaming kernel gets;
    ``sync_overhead_s``: the engine's fixed time per sync (reload call, cache reset)."""

    mfu: float = 0.40
    logprob_passes: int = 1
    optimizer_bytes: int = 30
    hbm_efficiency: float = 0.7
    sync_overhead_s: float = 0.05


MODEL = TrainerConstants()


@dataclass(frozen=True)
class Topology:
    """Where a step runs: the model ``shape`` (a step-cost table's), the ``gpu``, how many
    train (``trainer_gpus``) and whether the engine shares them (``colocated``: one after
    the other on the same GPUs; otherwise the engine has its own and the step is
    ``overlap``-accounted), how the trainer pads (``padding``: ``batch`` as TRL, ``packed``
    as verl with remove-padding), gradient checkpointing (``recompute``, TRL's default) and
    the sync's bandwidth in GB/s."""

    name: str
    shape: str
    gpu: str
    trainer_gpus: int
    colocated: bool
    padding: str = "batch"
    recompute: bool = True
    sync_gbps: float = 1000.0
    describe: str = ""

    @property
    def cost_spec(self) -> str:
        """The rollout's step-cost table (:func:`vllm_rl.cost.load_cost` spec)."""
        return f"{self.gpu}:{self.shape}"

    @property
    def accounting(self) -> str:
        """The headline accounting: ``colocated`` or ``overlap``."""
        return "colocated" if self.colocated else "overlap"


#: The named topologies.  The headline is the first: TRL's colocated mode, trainer and
#: engine on one H100 with the Qwen3-1.7B shape (the sync a device copy, ~1 TB/s).
TOPOLOGIES = {t.name: t for t in (
    Topology(
        "h100x1-colocated:qwen3-1.7b", "qwen3-1.7b", "h100", 1, True,
        describe="trainer and engine on one H100, one after the other (TRL colocated, "
                 "verl synchronous); Qwen3-1.7B shape; TRL's padding and gradient "
                 "checkpointing"),
    Topology(
        "h100x1-packed:qwen3-1.7b", "qwen3-1.7b", "h100", 1, True, padding="packed",
        describe="trainer and engine on one H100, one after the other, the trainer on "
                 "packed sequences (verl's use_remove_padding) with gradient "
                 "checkpointing; Qwen3-1.7B shape"),
    Topology(
        "h100x2-split:qwen3-1.7b", "qwen3-1.7b", "h100", 1, False, sync_gbps=150.0,
        describe="the engine on one H100, the trainer on another, one step overlapped "
                 "(a disaggregated one-step-off-policy trainer); sync by NCCL over NVLink "
                 "(150 GB/s); Qwen3-1.7B shape"),
    Topology(
        "h100x8-colocated:qwen3-8b", "qwen3-8b", "h100", 8, True, padding="packed",
        describe="the 8B shape trained over 8 H100s (FSDP, packed sequences as verl's "
                 "remove-padding) colocated with the engine; the rollout priced as one "
                 "engine on one H100 with the whole batch (an upper bound on the "
                 "engine's time: eight replicas would each decode an eighth, and a "
                 "decode step is flat up to tens of sequences)"),
)}


def topology(name: str | Topology) -> Topology:
    """A named topology (ValueError listing the names)."""
    if isinstance(name, Topology):
        return name
    try:
        return TOPOLOGIES[name]
    except KeyError:
        raise ValueError(f"unknown topology {name!r}; known: {sorted(TOPOLOGIES)}") from None


@dataclass(frozen=True)
class TrainedBatch:
    """What one step trains on: per row (a padding row included: it costs the same), its
    prompt and completion token counts."""

    prompt_lengths: tuple[int, ...]
    completion_lengths: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.prompt_lengths) != len(self.completion_lengths):
            raise ValueError("prompt_lengths and completion_lengths must have one entry "
                             "per row")
        for name in ("prompt_lengths", "completion_lengths"):
            for i, n in enumerate(getattr(self, name)):
                check_int(f"{name}[{i}]", n, 0)

    @classmethod
    def of(cls, prompts: list[int] | tuple[int, ...],
           completions: list[int] | tuple[int, ...]) -> TrainedBatch:
        return cls(tuple(prompts), tuple(completions))

    @property
    def rows(self) -> int:
        return len(self.prompt_lengths)

    @property
    def tokens(self) -> int:
        """The real tokens, unpadded."""
        return sum(self.prompt_lengths) + sum(self.completion_lengths)

    def sequences(self, padding: str) -> list[int]:
        """Each row's length as the trainer computes it: ``batch`` pads every prompt to
        the longest and every completion to the longest; ``packed`` keeps each row's own."""
        if padding == "batch":
            width = (max(self.prompt_lengths, default=0)
                     + max(self.completion_lengths, default=0))
            return [width] * self.rows
        if padding == "packed":
            return [p + c for p, c in zip(self.prompt_lengths, self.completion_lengths)]
        raise ValueError(f"padding must be 'batch' or 'packed', got {padding!r}")

    def to_dict(self) -> dict[str, Any]:
        return {"prompt_lengths": list(self.prompt_lengths),
                "completion_lengths": list(self.completion_lengths)}


@dataclass(frozen=True)
class TrainerTime:
    """One step's trainer time, in seconds, by part."""

    logprob_s: float
    train_s: float
    optimizer_s: float
    sync_s: float

    @property
    def trainer_s(self) -> float:
        """The trainer's own time: log-prob pass, forward and backward, optimizer."""
        return self.logprob_s + self.train_s + self.optimizer_s

    def to_dict(self) -> dict[str, float]:
        return {**asdict(self), "trainer_s": self.trainer_s}


@dataclass(frozen=True)
class TrainerCost:
    """The trainer's time per step on a :class:`Topology` (module docstring).  ``measured``:
    a GPU's measured seconds per pass (:meth:`load`) in place of the FLOPs model:
    ``{"forward_s_per_token": ..., "train_s_per_token": ..., "optimizer_s": ...}``."""

    topo: Topology
    constants: TrainerConstants = MODEL
    scale: float = 1.0
    measured: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_real("scale", self.scale, 0.0)
        if self.topo.shape not in SHAPES or self.topo.gpu not in GPUS:
            raise ValueError(f"topology {self.topo.name}: shape {self.topo.shape!r} or gpu "
                             f"{self.topo.gpu!r} unknown")

    @property
    def shape(self) -> Shape:
        return SHAPES[self.topo.shape]

    @property
    def source(self) -> str:
        """Where the figures come from: ``measured`` or ``modelled``."""
        return "measured" if self.measured else "modelled"

    def with_scale(self, scale: float) -> TrainerCost:
        """The same model with the trainer's passes and optimizer times ``scale`` (the
        sensitivity: 0.5 and 2)."""
        return replace(self, scale=scale)

    def _flops_s(self, flops: float) -> float:
        gpu = GPUS[self.topo.gpu]
        return flops / (gpu.peak_tflops * 1e12 * self.constants.mfu * self.topo.trainer_gpus)

    def forward_flops(self, batch: TrainedBatch) -> float:
        """One forward pass over the batch as padded: 2 N T + a(T) (module docstring)."""
        s = self.shape
        seqs = batch.sequences(self.topo.padding)
        attention = 2 * 2 * s.layers * s.heads * s.head_dim * sum(n * n / 2 for n in seqs)
        return 2 * s.matmul_params * sum(seqs) + attention

    def step(self, batch: TrainedBatch) -> TrainerTime:
        """The step's :class:`TrainerTime`."""
        c, s, gpu = self.constants, self.shape, GPUS[self.topo.gpu]
        seqs = batch.sequences(self.topo.padding)
        if self.measured:
            tokens = sum(seqs)
            logprob = c.logprob_passes * self.measured["forward_s_per_token"] * tokens
            train = self.measured["train_s_per_token"] * tokens
            optimizer = self.measured["optimizer_s"]
        else:
            fwd = self.forward_flops(batch)
            logprob = self._flops_s(c.logprob_passes * fwd)
            train = self._flops_s((4 if self.topo.recompute else 3) * fwd)
            optimizer = (s.params * c.optimizer_bytes
                         / (gpu.hbm_tbps * 1e12 * c.hbm_efficiency * self.topo.trainer_gpus))
        sync = s.params * 2 / (self.topo.sync_gbps * 1e9) + c.sync_overhead_s
        k = self.scale
        return TrainerTime(k * logprob, k * train, k * optimizer, sync)

    @classmethod
    def load(cls, topo: str | Topology, path: str | Path | None = None,
             scale: float = 1.0) -> TrainerCost:
        """The cost on ``topo``: modelled, or measured from ``path`` (the JSON
        :mod:`vllm_rl.cost.measure_trainer` writes, its row for the topology's shape)."""
        topo = topology(topo)
        if path is None:
            return cls(topo, scale=scale)
        doc = json.loads(Path(path).read_text())
        rows = [r for r in doc.get("rows", []) if r.get("shape") == topo.shape]
        if not rows:
            raise ValueError(f"{path}: no measured row for shape {topo.shape!r}")
        row = rows[-1]
        measured = {k: float(row[k]) / topo.trainer_gpus for k in
                    ("forward_s_per_token", "train_s_per_token")}
        measured["optimizer_s"] = float(row["optimizer_s"]) / topo.trainer_gpus
        return cls(topo, scale=scale, measured=measured)

    def describe(self) -> dict[str, Any]:
        """The topology and the constants a figure rests on (for a result's JSON)."""
        return {"topology": asdict(self.topo), "gpu": asdict(GPUS[self.topo.gpu]),
                "constants": asdict(self.constants), "scale": self.scale,
                "source": self.source, "measured": dict(self.measured)}


#: The accountings of a step's end-to-end time (:func:`end_to_end`).
ACCOUNTINGS = ("colocated", "overlap")


def end_to_end(rollout_s: float, trainer: TrainerTime, accounting: str) -> float:
    """A step's end-to-end seconds: ``colocated`` rollout + trainer + sync; ``overlap``
    max(rollout, trainer) + sync."""
    if accounting == "colocated":
        return rollout_s + trainer.trainer_s + trainer.sync_s
    if accounting == "overlap":
        return max(rollout_s, trainer.trainer_s) + trainer.sync_s
    raise ValueError(f"accounting must be one of {ACCOUNTINGS}, got {accounting!r}")
