"""Redis with a replica and Sentinels (kvserve.cluster.redis_ha) and clients that find the
primary through them (proto.sentinel): real redis-server processes, a real failover."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from kvpool.chain_index import ChainIndex, Link
from kvpool.net import free_local_ports
from kvserve.cluster.redis import RedisConfig
from kvserve.cluster.redis_ha import RedisHA
from proto.registry import connect

FAILOVER_WAIT_S = 60.0


@pytest.fixture(params=["password", "acl-user"])
def ha(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[RedisHA]:
    primary, replica, *sentinels = free_local_ports(5)
    user = "kvs" if request.param == "acl-user" else ""
    cfg = RedisConfig(port=primary, password='s3cret "quoted"', username=user)
    cluster = RedisHA(cfg, replica, sentinels, tmp_path)
    try:
        yield cluster.start()
    finally:
        cluster.stop()


def until_written(client: redis.Redis, key: str) -> float:
    """Seconds until a write of ``key`` succeeds (the failover's end, as a client sees it)."""
    start = time.monotonic()
    while time.monotonic() - start < FAILOVER_WAIT_S:
        try:
            client.set(key, "after")
            return time.monotonic() - start
        except (redis.ConnectionError, redis.TimeoutError, redis.ReadOnlyError):
            time.sleep(0.1)
    raise AssertionError(f"no primary took a write within {FAILOVER_WAIT_S} s")


def test_a_client_follows_the_primary_through_a_failover(ha: RedisHA) -> None:
    client = connect(ha.cluster_config, socket_timeout=1, socket_connect_timeout=1)
    assert client.dbsize() == 0  # nothing read from a file
    index = ChainIndex(client, "ha:pool")
    assert index.claim([Link("a", "", 10), Link("b", "a", 10)]).admitted == [True, True]
    client.set("before", "1")
    assert client.wait(1, 900) == 1  # replicated: the failover cannot lose these
    first = ha.primary_port()

    ha.nodes[first].kill()
    until_written(client, "after")
    assert ha.primary_port() != first
    assert client.get("before") == b"1" and client.get("after") == b"after"
    assert index.blocks() == ["a", "b"] and index.parent_of("b") == "a"
    assert index.claim([Link("c", "b", 10)]).admitted == [True]  # its scripts, loaded again

    ha.restart_node(first)  # back, empty, as a replica of the new primary
    rejoined = connect_to(ha, first)
    assert rejoined.info("replication")["role"] == "slave"
    deadline = time.monotonic() + FAILOVER_WAIT_S
    while rejoined.get("after") != b"after" and time.monotonic() < deadline:
        time.sleep(0.1)  # its first sync
    assert rejoined.get("after") == b"after"


def connect_to(ha: RedisHA, port: int) -> redis.Redis:
    at = RedisConfig(ha.cfg.host, port, ha.cfg.password, ha.cfg.username)
    return connect(at.cluster_config, socket_timeout=1)
