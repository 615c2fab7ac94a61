"""Hidden states kept on the worker for the trainer (``arrol.return_hidden``).

A sample scored at ``l_detect`` with ``return_hidden`` leaves its final-norm hidden
state here, keyed by its engine request id; its record carries only that key
(``RolloutInfo.hidden_id``), so records stay compact and no hidden state travels as
text in a record.  The client takes the vectors after the samples are back
(``arrol_hidden`` RPC: ``vllm_rl.LLM`` does it for you).  The store is bounded: past
``capacity`` vectors the oldest leave first, so a client that never asks costs memory
bounded by ``capacity * d * 4`` bytes.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Iterable, Mapping

DEFAULT_CAPACITY = 16_384


class HiddenStore:
    """Request id -> hidden state (the scorer puts float32 numpy vectors, read from its
    pinned host copy once the step has synchronised; a host tensor is taken too).

    Thread-safe: with vLLM's async output the scorer puts from the thread that runs the
    output's ``get_output``, while the ``arrol_hidden`` RPC takes from the worker's."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError(f"HiddenStore capacity={capacity}: allowed an int >= 1")
        self.capacity = capacity
        self._items: OrderedDict[str, Any] = OrderedDict()
        self._lock = threading.Lock()
        self.dropped = 0          # vectors that left unclaimed (capacity)

    def put(self, request_id: str, hidden: Any) -> None:
        """Keep ``hidden`` under ``request_id`` (replacing one kept there); past
        ``capacity`` the oldest leave."""
        with self._lock:
            self._items[request_id] = hidden
            self._items.move_to_end(request_id)
            while len(self._items) > self.capacity:
                self._items.popitem(last=False)
                self.dropped += 1

    def take(self, request_ids: Iterable[str]) -> dict[str, Any]:
        """Remove and return the vectors of these ids (float32 numpy; missing ids are
        absent from the result)."""
        if isinstance(request_ids, str):
            request_ids = [request_ids]
        with self._lock:
            found = [(rid, self._items.pop(rid, None)) for rid in request_ids]
        return {rid: _to_numpy(h) for rid, h in found if h is not None}

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._items

    def __len__(self) -> int:
        return len(self._items)


def _to_numpy(h: Any):
    import numpy as np

    if hasattr(h, "detach"):
        h = h.detach().float().cpu().numpy()
    return np.asarray(h, dtype=np.float32)



def hidden_to_wire(vectors: Mapping[str, Any]) -> dict[str, bytes]:
    """Hidden states as they leave the worker: float32 little-endian bytes per id.
    vLLM's engine core hands a utility result to its client with msgpack, which keeps
    bytes but not numpy arrays (they arrive as raw ``[dtype, shape, buffer index]``
    unless ``VLLM_ALLOW_INSECURE_SERIALIZATION`` is set)."""
    import numpy as np

    return {rid: np.asarray(h, dtype="<f4").reshape(-1).tobytes() for rid, h in vectors.items()}


def hidden_from_wire(wire: Mapping[str, Any]) -> dict[str, Any]:
    """:func:`hidden_to_wire`'s bytes (or vectors, from a worker in the same process) as
    float32 numpy vectors."""
    import numpy as np

    out = {}
    for rid, h in wire.items():
        if isinstance(h, (bytes, bytearray, memoryview)):
            out[rid] = np.frombuffer(bytes(h), dtype="<f4").astype(np.float32)
        else:
            out[rid] = np.asarray(h, dtype=np.float32).reshape(-1)
    return out

__all__ = ["DEFAULT_CAPACITY", "HiddenStore", "hidden_from_wire", "hidden_to_wire"]
