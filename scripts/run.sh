#!/usr/bin/env bash
# Quick start, command 1: set everything up, then run the whole disaggregated system on this
# machine (`kvserve up`: mooncake_master, Redis, 1 prefill + 1 decode worker, the router),
# answer one sample question through its OpenAI API, and keep serving until Ctrl-C.
# Arguments go to `kvserve up` (e.g. --ask "..." --exit-after-ask, --prefill 2, --mixed 2).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/kvserve up --ask "What is the capital of France? Answer in one sentence." "$@"
