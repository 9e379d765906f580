"""A worker's KV event publisher and the router's index reader over a real Redis (issue 19):
whatever the pool's cache goes through, the index of every router ends up holding exactly
the names the pool holds, including after lost events (a gap), a router that starts late, and
a worker restart; batches of workers outside the router's view are not applied."""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import redis

from kvpool.net import free_local_ports
from kvserve.cluster.redis import RedisConfig, RedisProcess
from proto.kv_events import EventBatch, Removed, Stored
from proto.kv_stream import publish_batch, stream_name
from proto.registry import ClusterConfig, connect
from proto.trust import new_secret
from router.placement.kv_index import KVIndex
from router.placement.prefix_index import Outcome
from workers.core.block_pool import BlockPool
from workers.serve import kv_publisher
from workers.serve.kv_publisher import EventPublisher


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterConfig]:
    (port,) = free_local_ports(1)
    log = tmp_path_factory.mktemp("redis") / "redis.log"
    with RedisProcess(RedisConfig(port=port), Path(log)) as server:
        yield dataclasses.replace(server.cluster_config, cluster="pub", cluster_secret=new_secret())


@pytest.fixture(autouse=True)
def empty_stream(cluster: ClusterConfig) -> None:
    client = connect(cluster)
    client.delete(stream_name(cluster.keys))
    client.close()


def worker(worker_id: str, started_at: float) -> Any:
    """What :meth:`KVIndex.sync` reads of a live worker."""
    return SimpleNamespace(worker_id=worker_id, record=SimpleNamespace(started_at=started_at))


def churn(pool: BlockPool, rng: random.Random, publisher: EventPublisher, rounds: int) -> None:
    """Requests come and go: pages taken (evicting), named, freed; one collection per
    round, as the engine loop does."""
    held: list[int] = []
    for _ in range(rounds):
        for _ in range(rng.randint(1, 6)):
            if held and rng.random() < 0.4:
                pool.free([held.pop(rng.randrange(len(held)))])
            elif pool.num_free:
                (page,) = pool.allocate(1)
                pool.cache(page, rng.randrange(1, 200), 0)
                held.append(page)
        publisher.collect(pool)
    pool.free(held)
    publisher.collect(pool)


async def converged(
    index: KVIndex, publisher: EventPublisher, pool: BlockPool, live: list[Any]
) -> None:
    """Until the index holds exactly the pool's names for the worker (syncing with the view
    as the registry poll does, collecting as the idle engine loop does)."""
    worker_id = live[0].worker_id
    for _ in range(300):
        index.sync(live)
        publisher.collect(pool)
        if index.index.synced(worker_id) and index.index.blocks(worker_id) == set(
            pool.cached_names()
        ):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{index.index.blocks(worker_id)} != {set(pool.cached_names())}")


def test_the_index_follows_a_churning_cache(cluster: ClusterConfig) -> None:
    pool, rng = BlockPool(32), random.Random(1)
    publisher = EventPublisher(cluster, "w0", 100.0)
    publisher.attach(pool)
    publisher.start()
    outcomes: list[Outcome] = []

    async def run() -> None:
        index, other = KVIndex(cluster, outcomes.append), KVIndex(cluster)  # two routers
        await index.start()
        await other.start()
        try:
            churn(pool, rng, publisher, 200)
            await converged(index, publisher, pool, [worker("w0", 100.0)])
            await converged(other, publisher, pool, [worker("w0", 100.0)])
        finally:
            await index.stop()
            await other.stop()

    try:
        asyncio.run(run())
    finally:
        publisher.stop()
    assert Outcome.APPLIED in outcomes and publisher.failed == 0


def test_lost_events_are_a_gap_healed_by_a_snapshot(
    cluster: ClusterConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full queue (Redis too slow) drops a delta: the next batch skips a seq, the index
    sees the gap and drops the worker until the snapshot that follows."""
    monkeypatch.setattr(kv_publisher, "MAX_QUEUED", 2)
    pool, rng = BlockPool(32), random.Random(2)
    publisher = EventPublisher(cluster, "w0", 100.0)
    publisher.attach(pool)
    outcomes: list[Outcome] = []

    async def run() -> None:
        index = KVIndex(cluster, outcomes.append)
        await index.start()
        index.sync([worker("w0", 100.0)])
        try:
            churn(pool, rng, publisher, 20)  # nothing sent yet: most of it is dropped
            assert publisher.failed > 0
            publisher.start()
            churn(pool, rng, publisher, 20)
            await converged(index, publisher, pool, [worker("w0", 100.0)])
        finally:
            await index.stop()

    try:
        asyncio.run(run())
    finally:
        publisher.stop()
    assert Outcome.GAP in outcomes and Outcome.SNAPSHOT in outcomes


def test_a_late_router_and_a_restarted_worker_catch_up_by_snapshots(
    cluster: ClusterConfig,
) -> None:
    first, rng = BlockPool(32), random.Random(3)
    publisher = EventPublisher(cluster, "w0", 100.0)
    publisher.attach(first)
    publisher.start()
    churn(first, rng, publisher, 50)  # published before any router reads

    async def run() -> None:
        index = KVIndex(cluster)
        await index.start()  # reads only what comes next: it asks for a snapshot
        try:
            await converged(index, publisher, first, [worker("w0", 100.0)])
            publisher.stop()
            restarted, later = BlockPool(32), EventPublisher(cluster, "w0", 200.0)
            later.attach(restarted)
            later.start()
            try:
                churn(restarted, rng, later, 5)
                await converged(index, later, restarted, [worker("w0", 200.0)])
            finally:
                later.stop()
            assert index.index.stats().restarts == 1
        finally:
            await index.stop()

    try:
        asyncio.run(run())
    finally:
        publisher.stop()


def test_only_workers_in_the_view_are_indexed(cluster: ClusterConfig) -> None:
    async def run() -> None:
        index = KVIndex(cluster)
        stranger = EventBatch("ghost", 1.0, 0, (Stored(7, 0),), snapshot=True)
        assert index.apply(stranger) is None  # not in the view
        index.sync([worker("w1", 5.0)])
        assert index.apply(EventBatch("w1", 4.0, 0, (Stored(7, 0),), snapshot=True)) is None
        assert index.apply(EventBatch("w1", 5.0, 0, (Stored(7, 0),), snapshot=True)) == (
            Outcome.SNAPSHOT
        )
        assert index.local_tokens([7, 8], 16) == {"w1": 16}
        index.placed(["w1"], [7, 8, 9])  # this router sent it a prompt: expected at once
        assert index.local_tokens([7, 8, 9, 10], 16) == {"w1": 48}
        assert index.apply(EventBatch("w1", 5.0, 1, (Removed(9),))) == Outcome.APPLIED
        assert index.local_tokens([7, 8, 9, 10], 16) == {"w1": 32}  # denied by its events
        index.sync([])  # w1 left the registry
        assert index.local_tokens([7, 8], 16) == {}
        await index.stop()

    asyncio.run(run())


def test_a_snapshot_request_reaches_the_worker(cluster: ClusterConfig) -> None:
    """A router asking for a snapshot makes the worker publish one (its blocks listed),
    though its cache did not change."""
    pool = BlockPool(4)
    (page,) = pool.allocate(1)
    pool.cache(page, 42, 0)
    publisher = EventPublisher(cluster, "w2", 7.0)
    publisher.attach(pool)
    publisher.start()
    client = connect(cluster)
    try:
        publisher.collect(pool)  # the first snapshot
        wait_for(lambda: entries(client, cluster) == 1)

        async def ask() -> None:
            index = KVIndex(cluster)
            index.sync([worker("w2", 7.0)])  # unknown to it: it asks
            await asyncio.sleep(0.2)
            await index.stop()

        asyncio.run(ask())

        def answered() -> bool:
            publisher.collect(pool)
            return entries(client, cluster) == 2

        wait_for(answered)
        newest: Any = client.xrevrange(stream_name(cluster.keys), count=1)
        body = newest[0][1][b"b"]
        assert b'"snapshot":true' in body and b'["2a"' in body
    finally:
        publisher.stop()
        client.close()


def entries(client: redis.Redis, cluster: ClusterConfig) -> int:
    return int(client.xlen(stream_name(cluster.keys)))


def wait_for(condition: Any, tries: int = 200) -> None:
    for _ in range(tries):
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError("condition never held")


def test_a_redis_failure_is_a_gap_then_a_snapshot(
    cluster: ClusterConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch Redis refuses keeps its seq; the next item is a snapshot."""
    pool = BlockPool(4)
    publisher = EventPublisher(cluster, "w3", 9.0)
    publisher.attach(pool)
    real = publish_batch
    calls: list[EventBatch] = []

    def flaky(client: redis.Redis, keys: Any, batch: EventBatch) -> bytes:
        calls.append(batch)
        if len(calls) == 2:
            raise redis.ConnectionError("down")
        return real(client, keys, batch)

    monkeypatch.setattr(kv_publisher, "publish_batch", flaky)
    try:
        publisher.start()
        publisher.collect(pool)  # snapshot, seq 0
        (page,) = pool.allocate(1)
        pool.cache(page, 5, 0)
        publisher.collect(pool)  # delta, seq 1: refused
        wait_for(lambda: len(calls) >= 2)
        publisher.collect(pool)  # the snapshot that follows, seq 2
        wait_for(lambda: len(calls) >= 3)
    finally:
        publisher.stop()
    assert [(b.seq, b.snapshot) for b in calls] == [(0, True), (1, False), (2, True)]
    assert calls[2].events == (Stored(5, 0),) and publisher.failed == 1
