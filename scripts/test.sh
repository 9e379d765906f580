#!/usr/bin/env bash
# Quick start, command 2: set everything up, then run the checks and the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
# The suite's own processes (setup's too) write bytecode even where the environment says not
# to (these machines set PYTHONDONTWRITEBYTECODE): otherwise each pytest process rewrote and
# compiled every test module as it collected them (17 s of CPU each, 9 s with pytest's
# rewrite cache), and every worker and router the tests start compiled the modules it
# imports. The files land in __pycache__ folders, which git ignores.
unset PYTHONDONTWRITEBYTECODE
# The tests marked vllm run vLLM's CPU build as the engine: setup installs it too. The
# packages come without their bytecode: the suite writes that of what it imports
# (KVSERVE_SETUP_BYTECODE, scripts/setup.sh).
KVSERVE_VLLM=${KVSERVE_VLLM:-1} KVSERVE_SETUP_BYTECODE=${KVSERVE_SETUP_BYTECODE:-0} \
  bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
# Torch's OpenMP threads sleep as soon as a parallel region ends instead of spinning for
# the next one: the suite runs more busy processes than there are cores, and threads that
# spin take the cores from the others (the exactness tests took 54-95 s each this way,
# under 14 s without). Serving keeps OpenMP's default; the clusters the tests start inherit
# this (kvserve/cluster/processes.py passes OMP_* on).
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
# And torch computes on one thread in the tests' own processes and in what they start without
# a thread count of its own (workers get theirs from their plan): the tests' models are tiny,
# so a second thread only adds its hand-offs, on cores the other processes need
# (tests/integration/test_exactness.py: 22-23.5 s of CPU against 25-26.5 s with 2 threads).
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
# mypy keeps its cache with the project's other caches (the models, the native kernels,
# vLLM's environment: workers.model.prepare.cache_dir), not in the clone: a fresh clone's
# mypy then re-checks only the modules that differ from what was last checked on this
# machine (1.3 s of CPU against 32 s for all of them, a clone of the same commit). mypy
# checks every cached module against its source's hash, so a stale entry is re-checked, not
# trusted.
export MYPY_CACHE_DIR="${MYPY_CACHE_DIR:-$(.venv/bin/python -c \
  'from workers.model.prepare import cache_dir; print(cache_dir() / "mypy")')}"
if [ $# -gt 0 ]; then
  .venv/bin/mypy
  exec .venv/bin/pytest -q --durations=20 "$@"
fi
# Everything else runs side by side, since most of the suite's time is spent waiting on
# servers: two passes of the tests, each test once, each pass on several processes
# (pytest-xdist; a file's tests stay on one process, so a module's cluster starts once;
# spreading them test by test ran too many clusters at once on 2 cores; files whose tests
# share a package's cluster stay on one process together), the longest files handed out
# first (tests/file_order.py, its scheduler and order; xdist's own reordering by test count
# is off), and mypy at a low priority (nice): the suite is CPU-bound on 2 cores from the
# passes' start to their end, so mypy (a second or two with its cache, 32 s of CPU without)
# takes what the first collection leaves and little of the passes' time. What saves CPU (a
# process start, a model made once) saves time.
# The tests that move KV through the pool (marked kv_path: the pool, landing, hand-off and
# fault tests) run with every transfer through the host staging slots, the GPU path's code
# but for the device copies (KVSERVE_KV_STAGING=always, tests/staging.py); everything else
# with the default, which moves a CPU cache in place. The unit tests (tests/unit: pure logic,
# no server, no pool of their own, so the staging mode is nothing to them; marked unit by
# tests/conftest.py) run in the kv_path pass too: its two processes ended about a minute
# before the main pass's three without them, leaving a core half idle meanwhile. Every test
# picks free ports and its own temporary directories, so tests on different processes are
# isolated; each pass hands out ports from a span of its own below the ephemeral range,
# split among its processes (KVSERVE_TEST_PORTS, tests/conftest.py), so no two processes
# pick the same free port. The slowest tests of each pass are listed at the end: the suite
# is kept well under 15 minutes on 2 cores. KVSERVE_TEST_PROCS sets the processes of the
# main pass (3), KVSERVE_KV_PROCS the kv_path pass's (2).
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
# the tiny model is made once for both passes, not once per process (tests/conftest.py)
export KVSERVE_TEST_MODELS="$logs/models"
nice -n 10 .venv/bin/mypy >"$logs/mypy" 2>&1 &
typing=$!
# Two processes collect the suite first, its unit tests and the rest side by side, beside
# mypy: they compile what the tests import and write pytest's rewritten test modules, once,
# where the passes' processes would each have done it at the same time on a fresh clone
# (five cold collections at once: 121 s of CPU; after a first collection, 61 s). One
# collection of the whole suite took 24 s of wall here, leaving the second core to mypy,
# which its cache (above) now keeps to a second or two; the two halves take 16 s (and 4 s
# more CPU, for what both import). A collection error shows in the passes.
.venv/bin/pytest -q --collect-only -p no:cacheprovider tests/unit >/dev/null 2>&1 &
first_half=$!
.venv/bin/pytest -q --collect-only -p no:cacheprovider tests --ignore=tests/unit \
  >/dev/null 2>&1 || true
wait "$first_half" || true
by_file=(--dist loadfile --no-loadscope-reorder)
# The kv_path pass collects the unit tests and, of the rest, only the files that name the
# marker (a module's pytestmark, or a test's: the marker is never added elsewhere), not the
# whole suite; the main pass leaves the unit tests uncollected.
mapfile -t kv_files < <(grep -rl --include='test_*.py' --exclude-dir=unit kv_path tests | sort)
KVSERVE_TEST_PORTS=26000-32000 KVSERVE_KV_STAGING=always .venv/bin/pytest -q -p no:cacheprovider \
  --durations=10 -m "kv_path or unit" -n "${KVSERVE_KV_PROCS:-2}" "${by_file[@]}" tests/unit \
  "${kv_files[@]}" >"$logs/staged" 2>&1 &
staged=$!
status=0
KVSERVE_TEST_PORTS=20000-26000 .venv/bin/pytest -q --durations=20 -m "not kv_path" \
  --ignore=tests/unit -n "${KVSERVE_TEST_PROCS:-3}" "${by_file[@]}" || status=$?
wait "$staged" || status=$?
echo "=== the kv_path and unit pass (KVSERVE_KV_STAGING=always) ==="
cat "$logs/staged"
wait "$typing" || status=$?
echo "=== mypy ==="
cat "$logs/mypy"
exit "$status"
