#!/usr/bin/env bash
# Quick start, command 2: set everything up, then run the checks and the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
# the tests marked vllm run vLLM's CPU build as the engine: setup installs it too
KVSERVE_VLLM=${KVSERVE_VLLM:-1} bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
# the 20 slowest tests are listed at the end: the suite is kept under 15 minutes on 2 cores
if [ $# -gt 0 ]; then
  exec .venv/bin/pytest -q --durations=20 "$@"
fi
# Two passes, each test once, side by side (most of a pass is waiting on servers, so the two
# share the 2 cores well): the tests that move KV through the pool (marked kv_path: the pool,
# landing, hand-off and fault tests) run with every transfer through the host staging slots,
# the GPU path's code but for the device copies (KVSERVE_KV_STAGING=always,
# tests/staging.py); everything else with the default, which moves a CPU cache in place.
# Every test picks free ports and its own temporary directories, so the passes are isolated.
staged_log=$(mktemp)
trap 'rm -f "$staged_log"' EXIT
KVSERVE_KV_STAGING=always .venv/bin/pytest -q -p no:cacheprovider --durations=10 -m kv_path \
  >"$staged_log" 2>&1 &
staged=$!
status=0
.venv/bin/pytest -q --durations=20 -m "not kv_path" || status=$?
wait "$staged" || status=$?
echo "=== the kv_path pass (KVSERVE_KV_STAGING=always) ==="
cat "$staged_log"
exit "$status"
