#!/usr/bin/env bash
# Install if needed, then run the main job: the rollout benchmark on the embedded model
# (extra arguments go to benchmarks/rollout.py, e.g. --help).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
exec "${VLLM_RL_VENV:-.venv}/bin/python" benchmarks/rollout.py "$@"
