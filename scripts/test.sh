#!/usr/bin/env bash
# Quick start, command 2: set everything up, then run the checks and the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
# the 20 slowest tests are listed at the end: the suite is kept under 15 minutes on 2 cores
exec .venv/bin/pytest -q --durations=20 "$@"
