#!/usr/bin/env bash
# Runs the unit and integration tests against another torch, to check pyproject.toml's torch
# range: a throwaway virtualenv with everything from requirements.lock (as scripts/setup.sh
# installs it), then the torch asked for (with what that build needs, e.g. its CUDA
# libraries: GBs for PyPI's CUDA builds, which import and run on a CPU), then this checkout.
#
#   bash scripts/torch_range.sh torch==2.6.0 [pytest arguments]   # default: tests/unit tests/integration
#
# Needs scripts/setup.sh to have run once (Debian packages, the default model). The native
# kernels are built for that torch into a cache directory of its own (KVSERVE_CACHE_DIR).
# About 10 minutes of tests on 2 cores, after the installs.
set -euo pipefail
cd "$(dirname "$0")/.."
spec=${1:?usage: scripts/torch_range.sh torch==VERSION [pytest arguments]}
shift
[ $# -gt 0 ] || set -- tests/unit tests/integration
python=${KVSERVE_PYTHON:-python3.11}
command -v "$python" >/dev/null 2>&1 || python=python3

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$python" -m venv "$work/venv"
pip=("$work/venv/bin/python" -m pip install -q --disable-pip-version-check)
"${pip[@]}" --require-hashes --no-deps -r requirements.lock
"${pip[@]}" "$spec"
"${pip[@]}" --no-deps --no-build-isolation -e .
"$work/venv/bin/python" -c 'import torch; print("torch_range: torch", torch.__version__)' >&2

# the converted models are reused; the kernels are built anew for this torch
cache=${KVSERVE_CACHE_DIR:-$HOME/.cache/kvserve}
mkdir -p "$work/cache"
[ -d "$cache/models" ] && ln -s "$(cd "$cache/models" && pwd)" "$work/cache/models"
KVSERVE_CACHE_DIR="$work/cache" "$work/venv/bin/python" -m pytest -q -p no:cacheprovider "$@"
