#!/usr/bin/env bash
# Install if needed, lint (ruff, the rules in pyproject.toml), then run the tests.
#   bash scripts/test.sh            the whole suite: the unit tier in a second pytest beside
#                                   the engine and integration tiers (their engines wait on
#                                   spawned processes most of the time; CI has two cores),
#                                   its output printed after theirs; fails if either fails
#   bash scripts/test.sh ARGS...    one pytest run with ARGS; its exit status is the script's
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
venv="${VLLM_RL_VENV:-.venv}"
"$venv/bin/python" -m ruff check .
if [ $# -gt 0 ]; then
  exec "$venv/bin/python" -m pytest "$@"
fi
unit_log=$(mktemp)
"$venv/bin/python" -m pytest -p no:cacheprovider tests/unit >"$unit_log" 2>&1 &
unit_pid=$!
engines=0
"$venv/bin/python" -m pytest tests/engine tests/integrations || engines=$?
unit=0
wait "$unit_pid" || unit=$?
echo "== the unit tier (run beside the engine and integration tiers): exit status $unit"
cat "$unit_log"
rm -f "$unit_log"
[ "$engines" -eq 0 ] && [ "$unit" -eq 0 ]
