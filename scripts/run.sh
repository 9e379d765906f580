#!/usr/bin/env bash
# Quick start, command 1: set everything up, then run the system's main job on this machine.
# For now that is text generation through the engine; arguments go to `kvserve generate`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [ $# -eq 0 ]; then
  set -- "What is the capital of France? Answer in one sentence."
fi
exec .venv/bin/kvserve generate "$@"
