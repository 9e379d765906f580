"""A cluster whose registry is a primary, a replica and three Sentinels (``kvserve up
--redis-ha``) and two routers behind nginx (``--routers 2``): the primary killed while a
stream runs through one router, the stream and the requests after it through the balancer
answer exactly, every worker is registered again on the new primary, and the old primary
comes back as a replica."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
import redis

from kvserve.cluster import faults
from kvserve.cluster.launch import Cluster
from kvserve.cluster.redis_ha import RedisHA
from tests.integration.test_faults import registered
from tests.midstream import LONG, complete, inject_when, stream_with_fault
from tests.tiny_cluster import client_at, cluster_client, prompt_of, tiny_cluster_spec

pytestmark = pytest.mark.kv_path

FAILOVER_WAIT_S = 60.0


@pytest.fixture(scope="module")
def cluster(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    spec = tiny_cluster_spec(
        tiny_model_dir,
        tmp_path_factory.mktemp("cluster"),
        redis_ha_ports=(1, 2, 3, 4),
        router_ports=(11, 12),
    )  # with_free_ports replaces them
    with Cluster(spec).start() as running:
        yield running


def test_the_registry_is_found_through_its_sentinels(cluster: Cluster) -> None:
    assert cluster.redis_url.startswith("redis+sentinel://")
    assert registered(cluster) == set(cluster.worker_names)


def test_a_failover_of_the_primary_while_a_stream_runs(cluster: Cluster) -> None:
    client: openai.OpenAI = cluster_client(cluster)
    prompt, short = prompt_of(40, 31), prompt_of(30, 32)
    reference, short_reference = complete(client, prompt, LONG), complete(client, short, 8)
    ha = cluster.redis
    assert isinstance(ha, RedisHA)
    first = ha.primary_port()

    ready = threading.Event()
    killer = inject_when(ready, lambda: faults.kill(cluster, "redis"))
    try:
        through = client_at(cluster.routers.urls["router-1"])
        assert stream_with_fault(through, prompt, LONG, after=5, fault=ready) == reference
    finally:
        killer.join(30)
    assert not ha.nodes[first].running
    assert complete(client, short, 8) == short_reference  # during or after the failover

    deadline = time.monotonic() + FAILOVER_WAIT_S
    while ha.named_primary() in (None, first):
        assert time.monotonic() < deadline, "the Sentinels named no new primary"
        time.sleep(0.1)
    while _registered(cluster) != set(cluster.worker_names):
        assert time.monotonic() < deadline, "workers did not register on the new primary"
        time.sleep(0.1)
    assert complete(client, short, 8) == short_reference

    cluster.restart("redis")  # the old primary, back as a replica
    assert ha.nodes[first].running and ha.primary_port() != first
    assert cluster.dead() == []


def _registered(cluster: Cluster) -> set[str]:
    """The registered workers; none while the Sentinels settle (a client's commands fail
    with a connection error until they agree on the new primary)."""
    try:
        return registered(cluster)
    except redis.ConnectionError:
        return set()
