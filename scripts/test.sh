#!/usr/bin/env bash
# Install if needed, lint (ruff, the rules in pyproject.toml), then run the tests.
#   bash scripts/test.sh            the whole suite, as three pytest runs side by side: the
#                                   engine and integration tiers in two shards (each test
#                                   drives one engine at a time, mostly on one core; CI has
#                                   two) and the unit tier; the first shard's output live,
#                                   the others' printed after it; fails if any fails
#   bash scripts/test.sh ARGS...    one pytest run with ARGS; its exit status is the script's
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
venv="${VLLM_RL_VENV:-.venv}"
"$venv/bin/python" -m ruff check .
if [ $# -gt 0 ]; then
  exec "$venv/bin/python" -m pytest "$@"
fi

# The second shard: the tests that start engines of their own (the benchmarks, Ray, the
# trainers' subprocesses, a module's in-process engine) and those on the session's plain
# engine (rl_llm), in this order, so that the plain engine starts once the benchmarks' are
# gone.  The first shard is every other engine and integration test: the session's DAS,
# ARRoL and served engines.  A new test file goes to the first unless named here.
second_shard=(
  tests/engine/test_bench_step.py
  tests/engine/test_bench_train.py
  tests/integrations/test_openrlhf.py
  tests/integrations/test_verl.py
  tests/integrations/test_own_model.py
  tests/engine/test_partial_faults.py
  tests/engine/test_async_engine.py
  tests/engine/test_stock_beside.py
  tests/engine/test_compile_cache.py
  tests/engine/test_kv_release.py
  tests/engine/test_partial_engine.py
  tests/engine/test_duet_engine.py
  tests/engine/test_darts_engine.py
  tests/engine/test_stock_equivalence.py
)
ignore=()
for path in "${second_shard[@]}"; do
  ignore+=("--ignore=$path")
done

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pytest() {   # pytest NAME ARGS...: its own base temporary folder, no cache
  local name=$1
  shift
  "$venv/bin/python" -m pytest -p no:cacheprovider --basetemp="$tmp/$name" "$@"
}
pytest unit tests/unit >"$tmp/unit.log" 2>&1 &
unit_pid=$!
pytest second "${second_shard[@]}" >"$tmp/second.log" 2>&1 &
second_pid=$!
first=0
pytest first tests/engine tests/integrations "${ignore[@]}" || first=$?
second=0
wait "$second_pid" || second=$?
unit=0
wait "$unit_pid" || unit=$?
echo "== the second shard of the engine and integration tiers: exit status $second"
cat "$tmp/second.log"
echo "== the unit tier: exit status $unit"
cat "$tmp/unit.log"
echo "== exit status: first shard $first, second shard $second, unit tier $unit"
[ "$first" -eq 0 ] && [ "$second" -eq 0 ] && [ "$unit" -eq 0 ]
