"""The P:D controller's lease against a real Redis: one holder at a time, renewed and
released only by it, taken over once it is released or has expired; a Redis outage is
"not held", never an exception. Then two routers' controllers (no workers: nothing to
move) share it: one decides, and the other takes over when it stops.

Times are never asserted: a takeover is polled for until a deadline well past the TTL.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from kvpool.net import free_local_ports
from kvserve.cluster.redis import RedisConfig, RedisProcess
from proto.registry import ClusterConfig
from router.config import RouterConfig
from router.control.controller import RoleController
from router.control.lease import MIN_TTL_S, ControllerLease, lease_key, lease_ttl_s
from router.observability.metrics import RouterMetrics
from router.placement.worker_view import WorkerView
from tests.integration.router_harness import running_redis

DEADLINE_S = 20.0
"""How long a takeover may take before the test fails (TTLs here: 1 s, or 60 s where only
a release can explain a takeover)."""


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running_redis(tmp_path_factory.mktemp("redis")) as url:
        yield url


def cluster_at(url: str) -> ClusterConfig:
    return ClusterConfig(redis_url=url, cluster=f"cl{uuid.uuid4().hex[:8]}")


def eventually(predicate: Callable[[], bool], deadline_s: float = DEADLINE_S) -> bool:
    until = time.monotonic() + deadline_s
    while time.monotonic() < until:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def stored(url: str, cluster: ClusterConfig) -> bytes | None:
    client = redis.Redis.from_url(url)
    try:
        value = client.get(lease_key(cluster.cluster))
        assert value is None or isinstance(value, bytes)
        return value
    finally:
        client.close()


def test_the_ttl_rule() -> None:
    assert lease_ttl_s(5.0) == 15.0
    assert lease_ttl_s(0.1) == MIN_TTL_S == 3.0


def test_one_holder_renewed_and_released_only_by_itself(redis_url: str) -> None:
    cluster = cluster_at(redis_url)
    a, b = ControllerLease(cluster, "A", 30.0), ControllerLease(cluster, "B", 30.0)
    try:
        assert a.take() and a.held and a.term == 1
        assert stored(redis_url, cluster) == b"A"
        assert not b.take() and not b.held and b.holder == "A" and b.term == 0
        assert b.look() == "A" and not b.held
        raw = redis.Redis.from_url(redis_url)
        raw.pexpire(lease_key(cluster.cluster), 5000)
        assert a.take() and a.term == 1  # renewed: the same term, the TTL reset
        assert raw.pttl(lease_key(cluster.cluster)) > 5000
        raw.close()
        assert not b.release() and stored(redis_url, cluster) == b"A"  # not B's to release
        assert not b.take() and stored(redis_url, cluster) == b"A"  # nor to renew
        assert a.release() and not a.held and stored(redis_url, cluster) is None
        assert b.take() and b.held and b.term == 1 and b.holder == "B"
        assert not a.take() and a.holder == "B"
        assert b.release() and a.look() is None  # nobody holds it now
    finally:
        a.close()
        b.close()


def test_an_expired_lease_goes_to_the_next_taker(redis_url: str) -> None:
    cluster = cluster_at(redis_url)
    a, b = ControllerLease(cluster, "A", 1.0), ControllerLease(cluster, "B", 1.0)
    try:
        assert a.take()
        assert eventually(b.take)  # A renews no more: its lease runs out, B's SET NX wins
        assert b.held and b.term == 1
        assert not a.take() and not a.held and a.holder == "B"  # A's renewal fails
        assert a.term == 1
    finally:
        a.close()
        b.close()


def test_redis_down_is_not_held_and_never_raises(tmp_path: Path) -> None:
    (port,) = free_local_ports(1)
    nowhere = ControllerLease(cluster_at(f"redis://127.0.0.1:{port}"), "A", 3.0)
    assert not nowhere.take() and not nowhere.held and nowhere.holder is None
    assert nowhere.look() is None and not nowhere.release()
    nowhere.close()
    server = RedisProcess(RedisConfig(port=port), tmp_path / "redis.log").start()
    lease = ControllerLease(cluster_at(server.url), "A", 30.0)
    try:
        assert lease.take() and lease.term == 1
        server.stop()
        assert not lease.take() and not lease.held  # the holder stops deciding at once
        server.restart(None, 20.0)  # back, empty
        assert lease.take() and lease.term == 2  # taken again: a new term
    finally:
        lease.close()
        server.stop()


def controller(cluster: ClusterConfig, router_id: str, ttl_s: float) -> RoleController:
    config = RouterConfig(controller=True, controller_interval_s=0.1, router_id=router_id)
    lease = ControllerLease(cluster, router_id, ttl_s)
    return RoleController(config, WorkerView(cluster), RouterMetrics(router_id), lease)


def leader_gauge(c: RoleController) -> float:
    value = c.metrics.registry.get_sample_value("kvserve:controller_leader")
    assert value is not None
    return value


def test_two_routers_one_decides_and_the_other_takes_over_on_stop(redis_url: str) -> None:
    cluster = cluster_at(redis_url)
    # a 60 s TTL: a takeover within the deadline can only come from the release on stop
    routers = {rid: controller(cluster, rid, 60.0) for rid in ("router-0", "router-1")}

    def holders() -> list[str]:
        return [rid for rid, c in routers.items() if c.lease.held]

    async def scenario() -> None:
        for c in routers.values():
            c.start()
        try:
            assert await asyncio.to_thread(eventually, lambda: len(holders()) == 1)
            (first,) = holders()
            (other,) = set(routers) - {first}
            leader, follower = routers[first], routers[other]
            await follower.observe_lease()
            assert leader.report()["lease"] == {"holder": first, "held_here": True}
            assert follower.report()["lease"] == {"holder": first, "held_here": False}
            assert (leader_gauge(leader), leader_gauge(follower)) == (1.0, 0.0)
            # the new holder's first decision waits a cool-down (the default 60 s)
            assert leader.report()["snapshot"]["cooldown_remaining_s"] > 0
            assert follower.report()["snapshot"]["cooldown_remaining_s"] == 0
            await leader.stop()
            assert not leader.lease.held and leader_gauge(leader) == 0.0
            assert await asyncio.to_thread(eventually, lambda: holders() == [other])
            assert follower.report()["lease"] == {"holder": other, "held_here": True}
            assert leader_gauge(follower) == 1.0
        finally:
            for c in routers.values():
                await c.stop()

    asyncio.run(scenario())
    assert stored(redis_url, cluster) is None  # the last holder released it on stop


def test_a_controller_without_redis_keeps_running_not_deciding() -> None:
    (port,) = free_local_ports(1)
    c = controller(cluster_at(f"redis://127.0.0.1:{port}"), "router-0", 3.0)

    async def scenario() -> bool:
        held = await c.lead()
        await c.observe_lease()
        await c.stop()
        return held

    assert not asyncio.run(scenario())
    assert leader_gauge(c) == 0.0
    assert c.report()["lease"] == {"holder": None, "held_here": False}
