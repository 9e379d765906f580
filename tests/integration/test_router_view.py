"""The router's worker view against a real Redis: a restarted worker is seen at once when a
flow asks (``WorkerView.renewed``), concurrent refreshes share one registry poll, and the
channel a restarted worker's replaced stays open for flows placed with it before."""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import redis
from grpc_health.v1 import _async as health_aio
from grpc_health.v1 import health_pb2_grpc
from grpc_health.v1.health_pb2 import HealthCheckRequest, HealthCheckResponse

from kvpool.net import free_local_ports
from proto import channels
from proto import worker_pb2 as pb
from proto.registry import ClusterConfig, WorkerRecord, publish
from router.placement.live_worker import LiveWorker
from router.placement.worker_view import WorkerView
from tests.integration.router_harness import running_redis


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running_redis(tmp_path_factory.mktemp("redis")) as url:
        yield url


def test_a_restarted_worker_is_renewed_at_once(redis_url: str, tmp_path: Path) -> None:
    cluster = ClusterConfig(redis_url=redis_url, cluster=f"rv{uuid.uuid4().hex[:8]}")
    now = time.time()
    first = WorkerRecord("w1", "127.0.0.1:1", "decode", "m", "/m", "c", 16, 2, 64, now, now)
    restarted = dataclasses.replace(first, started_at=now + 1, heartbeat_at=now + 1)
    client = redis.Redis.from_url(redis_url)
    publish(client, cluster.keys, first, ttl_s=30)
    polls: list[int] = []

    async def scenario() -> tuple[LiveWorker, LiveWorker | None, LiveWorker | None, int]:
        view = WorkerView(cluster, on_poll=lambda live: polls.append(len(live)), poll_s=3600)
        await view.start()  # one poll; the next periodic one is an hour away
        try:
            old = view.get("w1")
            assert old is not None
            same = await view.renewed(old)
            publish(client, cluster.keys, restarted, ttl_s=30)
            before = len(polls)
            await asyncio.gather(view.refresh(), view.refresh(), view.refresh())
            shared = len(polls) - before
            with pytest.raises(grpc.aio.AioRpcError) as old_call:  # not a closed channel
                await old.stub.GetLoad(pb.LoadRequest(), timeout=2)
            assert old_call.value.code() == grpc.StatusCode.UNAVAILABLE
            return old, same, await view.renewed(old), shared
        finally:
            await view.stop()

    try:
        old, same, new, shared_polls = asyncio.run(scenario())
    finally:
        client.delete(*client.keys(f"*{cluster.cluster}*"))
        client.close()
    assert same is None  # the same process serves it: nothing to renew
    assert new is not None and new.record.started_at == restarted.started_at
    assert new.stub is not old.stub  # a new channel, not the one backing off from the dead
    assert shared_polls == 1


def test_a_new_channel_does_not_inherit_the_old_ones_backoff() -> None:
    """A channel opened for a restarted worker connects at once: it does not share the
    connection (and its backoff) of the channel that was refused while nothing listened."""
    (port,) = free_local_ports(1)
    address, cluster = f"127.0.0.1:{port}", ClusterConfig()

    async def scenario() -> int:
        old = channels.channel(address, cluster)
        until = time.monotonic() + 1.5
        while time.monotonic() < until:  # refused again and again: its backoff grows to 1 s
            with pytest.raises(grpc.aio.AioRpcError):
                await health_pb2_grpc.HealthStub(old).Check(HealthCheckRequest(), timeout=0.2)
            await asyncio.sleep(0.05)
        server = grpc.aio.server()
        health_pb2_grpc.add_HealthServicer_to_server(health_aio.HealthServicer(), server)
        server.add_insecure_port(address)
        await server.start()
        try:
            new = channels.channel(address, cluster)
            reply = await health_pb2_grpc.HealthStub(new).Check(HealthCheckRequest(), timeout=5)
            await new.close(None)
            return int(reply.status)
        finally:
            await old.close(None)
            await server.stop(None)

    assert asyncio.run(scenario()) == HealthCheckResponse.SERVING
