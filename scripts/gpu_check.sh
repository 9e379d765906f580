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
  if [ -d "$site/nvidia/cuda_runtime/lib" ]; then  # libcudart.so.12 for Mooncake's CUDA build
    export LD_LIBRARY_PATH="$site/nvidia/cuda_runtime/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  fi
fi
if compgen -G ".whl/sys/*.deb" >/dev/null; then  # only the system libraries this machine lacks
  unpacked=/tmp/kvserve-gpu-debs libs=/tmp/kvserve-gpu-libs
  mkdir -p "$unpacked" "$libs"
  for deb in .whl/sys/*.deb; do dpkg-deb -x "$deb" "$unpacked"; done
  known="$(ldconfig -p)"
  for lib in $(find "$unpacked" -name 'lib*.so.*' \( -type f -o -type l \)); do
    name="$(basename "$lib")"
    grep -q "[[:space:]]$name " <<<"$known" || ln -sf "$lib" "$libs/$name"
  done
  echo "system libraries taken from .whl/sys: $(ls "$libs" | tr '\n' ' ')" >&2
  export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$libs"
fi
if store=$("$py" -c 'import importlib.util as u; print(u.find_spec("mooncake").submodule_search_locations[0])' 2>/dev/null); then
  ldd "$store/store.so" | grep "not found" >&2 || true
fi
export KVSERVE_CACHE_DIR="${KVSERVE_CACHE_DIR:-/tmp/kvserve-gpu-cache}"
budget="${KVSERVE_GPU_BUDGET_S:-540}"  # the whole run; bench engine gets what is left
args=(--out "$out" --budget-s "$budget")
if [ -d .whl/tokenizer ]; then args+=(--tokenizer-dir .whl/tokenizer); fi
if "$py" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  args+=(--device cuda)
else
  echo "no CUDA device here: running the CPU quick mode" >&2
  args+=(--device cpu --quick)
fi
exec timeout "$((budget + 40))" "$py" -m kvserve.gpucheck "${args[@]}"
