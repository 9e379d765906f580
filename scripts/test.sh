#!/usr/bin/env bash
# Quick start, command 2: set everything up, then run the checks and the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
# the 20 slowest tests are listed at the end: the suite is kept under 15 minutes on 2 cores
.venv/bin/pytest -q --durations=20 "$@"
if [ $# -eq 0 ]; then
  # the tests that move KV through the pool, again with every transfer through the host
  # staging slots: the GPU path's code, but for the device copies (tests/staging.py)
  KVSERVE_KV_STAGING=always exec .venv/bin/pytest -q -m kv_path
fi
