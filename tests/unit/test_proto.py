"""The checked-in gRPC code is exactly what scripts/gen_proto.sh makes from worker.proto,
and nothing on the wire can execute code when decoded."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from proto import worker_pb2 as pb

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ("worker_pb2.py", "worker_pb2.pyi", "worker_pb2_grpc.py", "worker_pb2_grpc.pyi")


def test_generated_code_is_reproducible(tmp_path: Path) -> None:
    subprocess.run(
        ["bash", str(ROOT / "scripts" / "gen_proto.sh"), str(tmp_path)],
        check=True,
        capture_output=True,
        env={"PYTHON": sys.executable, "PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin"},
    )
    for name in GENERATED:
        fresh = (tmp_path / "proto" / name).read_text()
        assert fresh == (ROOT / "proto" / name).read_text(), f"proto/{name} is stale"


def test_messages_round_trip_as_plain_protobuf() -> None:
    chunk = pb.TokenChunk(token_ids=[1, 2, 3], text="hé", finish_reason=pb.FINISH_REASON_STOP)
    chunk.usage.CopyFrom(pb.PromptUsage(prompt_tokens=10, pool_tokens=8, computed_tokens=2))
    again = pb.TokenChunk.FromString(chunk.SerializeToString())
    assert again == chunk
    request = pb.GenerateRequest(request_id="r", prompt_token_ids=[5])
    assert not request.HasField("first_token")
    request.first_token = 0  # token 0 is a real token: presence, not value, says "given"
    assert pb.GenerateRequest.FromString(request.SerializeToString()).HasField("first_token")


def test_no_pickle_in_the_serving_path() -> None:
    for folder in ("workers", "router", "proto", "kvpool"):
        for path in (ROOT / folder).rglob("*.py"):
            text = path.read_text()
            assert "import pickle" not in text and "pickle.loads" not in text, path
