"""The ``vllm-rl`` command: help texts, dispatch, and the ``serve`` argument building."""
import subprocess
import sys

import pytest

from vllm_rl.cli import main
from vllm_rl.cli import serve as cli_serve
from vllm_rl.cli.main import SUBCOMMANDS


def _run(*args):
    return subprocess.run([sys.executable, "-c", "import sys; from vllm_rl.cli import main; "
                           "sys.exit(main())", *args],
                          capture_output=True, text=True, timeout=120)


def test_top_level_help_lists_every_subcommand():
    r = _run("--help")
    assert r.returncode == 0, r.stderr
    for name in ("serve", "bench", "serve-bench"):
        assert f"  {name}" in r.stdout
    assert "vllm-rl bench" in r.stdout and "--stock" in r.stdout


def test_unknown_subcommand_fails_with_the_list(capsys):
    assert main(["nope"]) == 2
    assert "serve-bench" in capsys.readouterr().err


@pytest.mark.parametrize("name,words", [
    ("serve", ("--das", "--das-budget", "--arrol", "--stock", "--help=all", "/vllm_rl/das")),
    ("bench", ("step", "train", "das", "das-batch", "arrol", "arrol-gate", "overhead",
               "regime", "--help")),
    ("bench step", ("--prompts", "--max-tokens", "--configs", "--gpu-limits", "--cost", "--out",
                    "--task")),
    ("bench train", ("--seeds", "--steps", "--eval-prompts", "--quick", "--small", "--workers",
                     "--task", "--regime-log")),
    ("bench regime", ("--kits", "--prompts", "--heldout", "--from")),
    ("bench points", ("--sizes", "--task")),
    ("advise", ("--last-steps", "--json")),
    ("bench das", ("--epochs", "--configs")),
    ("bench das-batch", ("--sizes", "--repeats")),
    ("bench arrol", ("--l-detect", "--head-inputs")),
    ("bench arrol-gate", ("--prompts", "--n", "--draws")),
    ("bench overhead", ("--repeats", "--profile", "--mode", "--live", "--workloads",
                        "--min-tokens", "--live-floor")),
    ("serve-bench", ("--base-url", "--group-as", "--techniques", "--concurrency",
                     "--request-rate", "request_throughput")),
])
def test_subcommand_help(name, words):
    r = _run(*name.split(), "--help")
    assert r.returncode == 0, r.stderr
    assert f"vllm-rl {name}" in r.stdout
    for w in words:
        assert w in r.stdout, (w, r.stdout)
    assert set(SUBCOMMANDS) == {"serve", "bench", "advise", "serve-bench"}


def test_serve_builds_rl_flags_and_embedded_model():
    from vllm_rl.task import MODEL_PATH

    args, env = cli_serve.build(["--das", "--das-budget", "2", "--arrol", "--port", "8001"])
    assert args[0] == str(MODEL_PATH) and args[1:3] == ["--port", "8001"]
    assert "vllm_rl.engine.scheduler.RLSyncScheduler" in args
    spec = args[args.index("--speculative-config") + 1]
    assert '"num_speculative_tokens": 4' in spec            # 2b with b = 2
    assert "vllm_rl_arrol" in args[args.index("--additional-config") + 1]
    assert "vllm_rl" in env["VLLM_PLUGINS"].split(",") and env["VLLM_USE_V2_MODEL_RUNNER"] == "0"
    assert env["VLLM_RL_ENGINE"] == "1"                      # the server asks for the patches
    assert "--kv-cache-memory-bytes" in args                 # CPU: a bounded KV cache


def test_serve_bare_das_starts_the_drafter_with_defaults():
    args, env = cli_serve.build(["--das"])
    assert "--speculative-config" in args and "vllm_rl_das" in " ".join(args)
    assert "VLLM_USE_V2_MODEL_RUNNER" not in env


def test_serve_keeps_a_given_model_and_scheduler():
    args, _ = cli_serve.build(["some/model", "--scheduler-cls", "x.Y", "--gpu-memory-utilization",
                               "0.5"])
    assert args == ["some/model", "--scheduler-cls", "x.Y", "--gpu-memory-utilization", "0.5"]


def test_serve_stock_is_plain_vllm(monkeypatch):
    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    args, env = cli_serve.build(["--stock", "--port", "8002"])
    assert not any("vllm_rl" in a for a in args[1:])
    assert "vllm_rl" not in env["VLLM_PLUGINS"].split(",") and "VLLM_RL_ENGINE" not in env
    with pytest.raises(SystemExit):
        cli_serve.build(["--stock", "--das"])


def test_bench_rejects_unknown_configs_and_subcommands():
    r = _run("bench", "--configs", "darts,nope")
    assert r.returncode == 2 and "nope" in r.stderr
    r = _run("bench", "nope")
    assert r.returncode != 0 and "unknown subcommand" in r.stderr


def test_results_record_what_they_ran_on():
    """``bench train``'s JSON names the checkout's commit and the engine's versions."""
    from vllm_rl.bench.logs import provenance

    p = provenance()
    assert p["commit"] is None or (len(p["commit"]) == 40 and isinstance(p["dirty"], bool))
    assert p["vllm"] and p["torch"]
