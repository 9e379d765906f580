"""One real worker process (``kvserve worker``) against real Redis and mooncake_master:
registration and its record, the role change that drains first (taking over its
reservations even so), the refusal of a worker
whose KV contract differs from the cluster's, and a clean exit that withdraws the record."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import redis

from proto import worker_pb2 as pb
from proto import worker_pb2_grpc
from proto.prefill import prefill_answer
from proto.registry import Keys, WorkerRecord, list_workers
from tests.integration.worker_process import Services, start_worker, wait_serving, worker_services


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Services]:
    with worker_services(tmp_path_factory.mktemp("services")) as running:
        yield running


def record(redis_url: str, worker_id: str) -> WorkerRecord | None:
    client = redis.Redis.from_url(redis_url)
    return next((r for r in list_workers(client, Keys()) if r.worker_id == worker_id), None)


def test_worker_registers_drains_on_role_change_refuses_misfits_and_withdraws(
    services: Services, tiny_model_dir: Path, tmp_path: Path
) -> None:
    redis_url = services[0]
    proc, address = start_worker("w-mixed", tiny_model_dir, services, tmp_path, "--role", "mixed")
    try:
        wait_serving(address, proc)
        rec = record(redis_url, "w-mixed")
        assert rec is not None and rec.role == "mixed" and rec.address == address
        assert rec.block_tokens == 16 and "|" in rec.contract and rec.load["role"] == "mixed"

        channel = grpc.insecure_channel(address)
        stub = worker_pb2_grpc.WorkerStub(channel)
        params = pb.SamplingParams(max_tokens=300, temperature=0, ignore_eos=True)
        request = pb.GenerateRequest(request_id="long", prompt_token_ids=[5, 6, 7], params=params)
        chunks: list[pb.TokenChunk] = []
        streaming = threading.Thread(target=lambda: chunks.extend(stub.Generate(request)))
        streaming.start()
        while not chunks:
            time.sleep(0.01)
        # a request handed over from a prefill: reserved here, its first token computed
        held_prompt = list(range(40, 60))
        reserve = pb.ReserveRequest(request_id="held", prompt_token_ids=held_prompt,
                                    max_tokens=4, lease_ms=60_000)  # fmt: skip
        assert stub.Reserve(reserve, timeout=30).ok
        greedy = pb.SamplingParams(max_tokens=4, temperature=0)
        prefill = pb.PrefillRequest(request_id="held-p", prompt_token_ids=held_prompt,
                                    params=greedy)  # fmt: skip
        first = prefill_answer(stub.Prefill(prefill, timeout=60)).first_token
        changed: list[pb.SetRoleReply] = []
        switching = threading.Thread(
            target=lambda: changed.append(stub.SetRole(pb.SetRoleRequest(role="decode")))
        )
        switching.start()
        while not ((r := record(redis_url, "w-mixed")) and r.load.get("draining")):
            time.sleep(0.02)
        with pytest.raises(grpc.RpcError) as refused:  # new work waits for the next role
            list(stub.Generate(pb.GenerateRequest(request_id="new", prompt_token_ids=[1],
                                                  params=params)))  # fmt: skip
        assert refused.value.code() is grpc.StatusCode.UNAVAILABLE
        # the reservation is work the worker holds: its Generate is taken while draining
        handed = pb.GenerateRequest(request_id="held", prompt_token_ids=held_prompt,
                                    params=greedy, first_token=first)  # fmt: skip
        taken = list(stub.Generate(handed, timeout=60))
        assert sum(len(c.token_ids) for c in taken) == 3
        assert taken[-1].finish_reason == pb.FINISH_REASON_LENGTH
        switching.join(60)
        streaming.join(60)
        # The request in flight ran to its end before the role changed.
        assert sum(len(c.token_ids) for c in chunks) == 300
        assert chunks[-1].finish_reason == pb.FINISH_REASON_LENGTH
        assert changed and changed[0].role == "decode" and changed[0].previous == "mixed"
        rec = record(redis_url, "w-mixed")
        assert rec is not None and rec.role == "decode"
        channel.close()

        misfit, _ = start_worker(
            "w-misfit", tiny_model_dir, services, tmp_path, "--block-tokens", "32"
        )
        assert misfit.wait(120) == 1
        assert "contract differs" in misfit.log_tail(50)
        assert record(redis_url, "w-misfit") is None
    finally:
        proc.terminate()
    assert proc.wait(30) == 0
    assert record(redis_url, "w-mixed") is None
