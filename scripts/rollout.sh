#!/usr/bin/env bash
# Install if needed, then run the main job: `vllm-rl bench`, one rollout step on the
# embedded model (every technique and all combined vs stock vLLM, a few minutes; extra
# arguments go to it: `bash scripts/rollout.sh --help`; `train` etc. pick a benchmark).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
venv="${VLLM_RL_VENV:-.venv}"
if [[ -x "$venv/bin/vllm-rl" ]]; then
  exec "$venv/bin/vllm-rl" bench "$@"
fi
exec "$venv/bin/python" -m vllm_rl.cli bench "$@"   # an environment from before the script
