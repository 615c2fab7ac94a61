"""``vllm-rl serve``: vLLM's OpenAI-compatible server on the RL engine.

    vllm-rl serve                                  # the embedded model, RL scheduler
    vllm-rl serve MODEL --das --das-policy class   # + the DAS drafter
    vllm-rl serve MODEL --arrol                    # + ARRoL's quality head
    vllm-rl serve MODEL --stock                    # plain vLLM (no vllm_rl), same install

:mod:`vllm_rl.serve` does the work (``python -m vllm_rl.serve MODEL`` is the same server):
vLLM's own CLI ``serve`` subcommand, so every ``vllm serve`` option works (``vllm-rl serve
--help=all`` lists vLLM's), with the RL flags (:func:`vllm_rl.llm.server_args`) unless
``--scheduler-cls`` is given.  The command adds the embedded demo model
(:data:`vllm_rl.task.MODEL_PATH`) where no model is named.
"""
from __future__ import annotations

from pathlib import Path

from vllm_rl import serve

PROG = "vllm-rl serve"
USAGE = "{prog} [MODEL] [--das ...] [--arrol] [--stock] [any vllm serve option]"
DESCRIPTION = ("The OpenAI-compatible server (vLLM's `serve`) on the RL engine.  MODEL "
               "defaults to the embedded model.  Every `vllm serve` option passes through "
               "(`{prog} --help=all` lists them).  Routes besides vLLM's: "
               "/vllm_rl/das/{{prebuild,clear,stats}}, /vllm_rl/arrol, /vllm_rl/reload_weights "
               "(README: 'Routes').")


def _embedded_model() -> Path:
    from vllm_rl.task import MODEL_PATH

    return MODEL_PATH


def build(argv: list[str]) -> tuple[list[str], dict[str, str]]:
    """(the ``vllm serve`` arguments, environment changes) for ``vllm-rl serve argv``."""
    return serve.build(argv, default_model=_embedded_model(), prog=PROG)


def main(argv: list[str] | None = None) -> None:
    serve.main(argv, default_model=_embedded_model(), prog=PROG, usage=USAGE,
               description=DESCRIPTION)
