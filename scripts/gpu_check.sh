#!/usr/bin/env bash
# The one prepared check of the GPU path (docs/gpu.md): engine exactness against
# transformers on the GPU, the KV pool round trip GPU -> pool -> GPU across two processes
# (host staging, and in place), and `kvserve bench engine` there; one JSON file of results.
# Needs only torch with CUDA, transformers, safetensors and xxhash installed; anything else
# comes from the wheels scripts/gpu_wheels.sh put in .whl/ beside the checkout (no network).
# Usage: scripts/gpu_check.sh [OUT.json]  (default: $OUT/gpu_check.json where OUT is set,
# else ./gpu_check.json). Without a CUDA device it runs the CPU quick mode instead.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:+$OUT/gpu_check.json}}"
out="${out:-gpu_check.json}"
py="${KVSERVE_PYTHON:-python3}"
site=/tmp/kvserve-gpu-site
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if compgen -G ".whl/*.whl" >/dev/null; then
  "$py" -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$site" .whl/*.whl
  export PYTHONPATH="$site:$PYTHONPATH" PATH="$site/bin:$PATH"  # mooncake_master is in bin/
fi
export KVSERVE_CACHE_DIR="${KVSERVE_CACHE_DIR:-/tmp/kvserve-gpu-cache}"
args=(--out "$out")
if [ -d .whl/tokenizer ]; then args+=(--tokenizer-dir .whl/tokenizer); fi
if "$py" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  args+=(--device cuda)
else
  echo "no CUDA device here: running the CPU quick mode" >&2
  args+=(--device cpu --quick)
fi
exec timeout 580 "$py" -m kvserve.gpucheck "${args[@]}"
