#!/usr/bin/env bash
# Install if needed, lint (ruff, the rules in pyproject.toml), then run the whole test suite
# (extra arguments go to pytest; its exit status is the script's).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
venv="${VLLM_RL_VENV:-.venv}"
"$venv/bin/python" -m ruff check .
exec "$venv/bin/python" -m pytest "$@"
