"""A steady CPU load beside the engine: ``--host-load N`` of ``vllm-rl bench step`` and
``vllm-rl bench points``.

A GPU server's host is rarely idle: reward functions, data loading and tokenizing share
its cores with the engine.  :class:`HostLoad` starts ``N`` processes that each spin a
pure-Python loop, on the CPUs this process may run on (a child inherits its parent's
affinity, so under ``taskset -c K`` every one of them shares core K with the engine:
the worst case, the engine's own core contended), and stops them on exit.  The load is
steady: it neither sleeps nor waits, so the engine's host work runs at the share of its
core the OS scheduler leaves it for as long as the load is on.

The benches hold it over the timed steps only, stock's and every configuration's alike,
so each speed-up compares engines under the same load.
"""
from __future__ import annotations

import os
import subprocess
import sys

__all__ = ["HostLoad"]

SPIN = "while True:\n    pass\n"


class HostLoad:
    """``processes`` busy processes while entered (none for 0)."""

    def __init__(self, processes: int) -> None:
        if processes < 0:
            raise ValueError(f"host load: processes >= 0, got {processes}")
        self.processes = processes
        self._procs: list[subprocess.Popen] = []

    @property
    def cpus(self) -> list[int]:
        """The CPUs the load (and this process) may run on."""
        return sorted(os.sched_getaffinity(0))

    def __enter__(self) -> "HostLoad":
        for _ in range(self.processes):
            self._procs.append(subprocess.Popen([sys.executable, "-c", SPIN],
                                                stdin=subprocess.DEVNULL,
                                                stdout=subprocess.DEVNULL,
                                                stderr=subprocess.DEVNULL))
        return self

    def __exit__(self, *exc) -> None:
        for proc in self._procs:
            proc.kill()
        for proc in self._procs:
            proc.wait()
        self._procs.clear()

    def __repr__(self) -> str:
        return f"HostLoad({self.processes} on CPUs {self.cpus})"
