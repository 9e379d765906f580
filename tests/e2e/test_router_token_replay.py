"""A worker that is broken into cannot replay the router's token to the other workers
(:mod:`proto.call_tokens`), on the cluster this folder shares (``eval_cluster``: the real
router, a prefill and a decode worker, Redis and mooncake_master, with the grants
``kvserve up`` hands out).

The broken-into worker is played by the test, holding only what a worker's grant holds: with
its registry-record key it registers a decode worker of its own in the cluster's Redis, a gRPC
server on 127.0.0.1 that keeps the ``authorization`` of every call and answers ``Reserve``
"no free pages now". The real router, serving real requests, reserves on it first (it looks
idle). Every token it captured is then replayed to the real workers' ``SetRole`` and
``Abort``: both refuse (UNAUTHENTICATED, saying the token is addressed to another worker) and
keep their role; the requests complete on the real decode worker.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from typing import Any

import grpc
import pytest

from kvserve.cluster import faults
from kvserve.cluster.launch import Cluster
from proto import worker_pb2 as pb
from proto.grants import grant
from proto.registry import connect, list_workers, seal_record
from proto.worker_pb2_grpc import WorkerServicer, WorkerStub, add_WorkerServicer_to_server
from tests.tiny_cluster import MODEL_NAME, cluster_client, prompt_of, router_status

EVIL = "decode-evil"


class Capturing(WorkerServicer):
    """The broken-into worker's server: keeps each call's authorization, reserves nothing."""

    def __init__(self) -> None:
        self.captured: list[str] = []

    def _keep(self, context: grpc.ServicerContext) -> None:
        meta = context.invocation_metadata() or ()
        self.captured += [str(v) for k, v in meta if k == "authorization"]

    def Reserve(self, request: pb.ReserveRequest, context: Any) -> pb.ReserveReply:  # noqa: N802
        self._keep(context)
        return pb.ReserveReply(ok=False, reason="no free pages now")

    def Abort(self, request: pb.AbortRequest, context: Any) -> pb.AbortReply:  # noqa: N802
        self._keep(context)
        return pb.AbortReply(found=False)


@contextmanager
def capturing_server() -> Iterator[tuple[str, Capturing]]:
    servicer = Capturing()  # type: ignore[abstract]  # the verbs it lacks: UNIMPLEMENTED
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    add_WorkerServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}", servicer
    finally:
        server.stop(None)


@pytest.mark.timeout(300)
def test_a_broken_into_worker_cannot_replay_the_routers_token(eval_cluster: Cluster) -> None:
    cluster = eval_cluster
    config = cluster.cluster_config
    stolen = dataclasses.replace(config, cluster_secret=grant(config.cluster_secret, "worker"))
    keys = stolen.keys  # the registry-record key every worker holds
    client = cluster_client(cluster)
    registry = connect(config)
    try:
        real = next(r for r in list_workers(registry, config.keys) if r.role == "decode")
        with capturing_server() as (address, evil):
            deadline = time.monotonic() + 120
            seed = 0
            while not evil.captured and time.monotonic() < deadline:
                now = time.time()
                load = {**real.load, "free_pages": 10**6, "running": 0, "waiting": 0}
                record = dataclasses.replace(
                    real, worker_id=EVIL, address=address, started_at=now, heartbeat_at=now,
                    load=load,
                )  # fmt: skip
                registry.set(keys.worker(EVIL), seal_record(keys, record))
                seed += 1
                done = client.completions.create(
                    model=MODEL_NAME, prompt=prompt_of(20, 900 + seed), max_tokens=2,
                    temperature=0,
                )  # fmt: skip
                assert done.choices[0].text  # served by the real decode worker
        assert evil.captured, "the router never called the registered worker"
    finally:
        registry.delete(keys.worker(EVIL))
        registry.close()
        gone(cluster)  # the folder's next tests see the cluster as it was
    for name in cluster.worker_names:
        with grpc.insecure_channel(cluster.plan_of(name).address) as channel:
            for token in sorted(set(evil.captured)):
                for code, details in replayed(WorkerStub(channel), token):
                    assert code == grpc.StatusCode.UNAUTHENTICATED and "addressed to" in details
        assert faults.load_of(cluster, name).role == cluster.plan_of(name).role


def gone(cluster: Cluster) -> None:
    """Wait until the router's view holds the cluster's own workers only (it keeps a worker
    whose record went away for a while)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        shown = {w.worker_id for w in router_status(cluster).workers}
        if shown == set(cluster.worker_names):
            return
        time.sleep(0.2)
    raise AssertionError(f"the router still shows {sorted(shown)}")


def replayed(stub: WorkerStub, token: str) -> list[tuple[grpc.StatusCode, str]]:
    """The status and details of ``SetRole`` and ``Abort`` called with ``token``."""
    meta = (("authorization", token),)
    out = []
    for call in (
        lambda: stub.SetRole(pb.SetRoleRequest(role="prefill"), metadata=meta, timeout=30),
        lambda: stub.Abort(pb.AbortRequest(request_id="x"), metadata=meta, timeout=30),
    ):
        try:
            call()
            out.append((grpc.StatusCode.OK, ""))
        except grpc.RpcError as exc:
            out.append((exc.code(), str(exc.details())))
    return out
