#!/usr/bin/env bash
# Install if needed, then run the whole test suite (extra arguments go to pytest).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
exec "${VLLM_RL_VENV:-.venv}/bin/python" -m pytest "$@"
