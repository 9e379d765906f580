#!/usr/bin/env bash
# Regenerate proto/worker_pb2*.py(i) from proto/worker.proto (typed stubs via mypy-protobuf).
# tests/unit/test_proto.py regenerates into a temporary folder and diffs against the tree.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-$root}"
py="${PYTHON:-$root/.venv/bin/python}"
cd "$root"
export PATH="$(dirname "$py"):$PATH"  # protoc-gen-mypy lives next to the interpreter
"$py" -m grpc_tools.protoc -I . \
  --python_out="$out" --mypy_out="$out" \
  --grpc_python_out="$out" --mypy_grpc_out="$out" \
  proto/worker.proto
