"""The ARRoL scorer's only crossings between host and device (:class:`Transfer`): index
tensors up from pinned memory without blocking, results down into pinned memory without
blocking, read only after vLLM itself has waited for the device in that step
(:mod:`vllm_rl.arrol.scorer`, "No host–device synchronisation is added to the step")."""
from __future__ import annotations

import numpy as np
import torch


class Transfer:
    """The scorer's only crossings between host and device.

    :meth:`up`: host integers to the device, from pinned memory, without blocking;
    :meth:`down`: a device tensor to a pinned host tensor, without blocking (PyTorch pins
    the destination of a non-blocking CUDA-to-CPU copy); :meth:`ready`: an event after a
    step's copies; :meth:`wait`: called only after vLLM has synchronised in that step.
    Off CUDA (vLLM's CPU platform) the device is the host: ``up`` builds the tensor,
    ``down`` is the identity, there are no events."""

    def __init__(self, device) -> None:
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"

    def up(self, *parts) -> list[torch.Tensor]:
        """One int64 device tensor per part (lists or arrays of ints), all sent in one
        non-blocking copy from pinned memory."""
        arrays = [np.asarray(p, dtype=np.int64) for p in parts]
        sizes = [a.shape[0] for a in arrays]
        host = torch.from_numpy(np.concatenate(arrays) if len(arrays) > 1 else arrays[0])
        if self.cuda:
            dev = host.pin_memory().to(self.device, non_blocking=True)
        else:
            dev = host.to(self.device)
        return list(dev.split(sizes)) if len(parts) > 1 else [dev]

    def down(self, t: torch.Tensor) -> torch.Tensor:
        return t.to("cpu", non_blocking=True) if self.cuda else t

    def ready(self):
        if not self.cuda:
            return None
        event = torch.cuda.Event()
        event.record()
        return event

    def wait(self, event) -> None:
        if event is not None:
            event.synchronize()


__all__ = ["Transfer"]
