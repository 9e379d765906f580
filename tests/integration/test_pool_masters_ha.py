"""The pool's masters without a single point of failure (``kvserve up --pool-masters 2``):
two ``mooncake_master`` in Mooncake's HA mode electing a leader through three etcd members,
members addressing them through etcd, two routers in front. The leader killed while a
stream runs through one router: the stream and the requests after it answer exactly, a
standby takes the lead, the pool carries prompts again (a decode worker takes a whole
prompt from it), and the killed master comes back as a standby."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from kvserve.cluster import faults
from kvserve.cluster.launch import Cluster
from kvserve.cluster.pool_ha import leader, wait_leader
from tests.midstream import LONG, complete, inject_when, stream_with_fault
from tests.tiny_cluster import client_at, cluster_client, prompt_of, tiny_cluster_spec

pytestmark = pytest.mark.kv_path

FAILOVER_WAIT_S = 90.0


@pytest.fixture(scope="module")
def cluster(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    spec = tiny_cluster_spec(
        tiny_model_dir,
        tmp_path_factory.mktemp("cluster"),
        pool_masters=2,
        pool_ha_ports=tuple(range(21, 29)),
        router_ports=(11, 12),
        router_args=("--kv-handoff", "pool"),  # every prompt through the pool (no push)
    )  # with_free_ports replaces the placeholders
    with Cluster(spec).start() as running:
        yield running


def carried(cluster: Cluster, client: openai.OpenAI, prompt: list[int]) -> bool:
    """Complete ``prompt``; whether the decode worker took its KV from the pool (it read
    some, and computed none of the prompt: with the pool out, it computes the prompt)."""
    before = faults.load_of(cluster, "decode-0", 10.0)
    complete(client, prompt, 4)
    after = faults.load_of(cluster, "decode-0", 10.0)
    read = after.kv_bytes_read > before.kv_bytes_read
    return read and after.prompt_tokens_computed == before.prompt_tokens_computed


def test_the_members_address_the_masters_through_etcd(cluster: Cluster) -> None:
    ha = cluster.spec.pool_ha
    assert ha is not None
    argv = " ".join(cluster.plan_of("decode-0").argv)
    assert f"--pool-master {ha.address}" in argv and ha.address.count(";") == 2
    assert leader(ha) in ("mooncake_master", "mooncake_master-1")


def test_the_leading_master_killed_while_a_stream_runs(cluster: Cluster) -> None:
    ha = cluster.spec.pool_ha
    assert ha is not None
    first = wait_leader(ha, 30.0)
    balancer = cluster_client(cluster)
    assert carried(cluster, balancer, prompt_of(64, 80))
    prompt = prompt_of(40, 81)
    reference = complete(balancer, prompt, LONG)

    ready = threading.Event()
    killer = inject_when(ready, lambda: faults.kill(cluster, first))
    through = client_at(cluster.routers.urls["router-1"])
    try:
        assert stream_with_fault(through, prompt, LONG, after=5, fault=ready) == reference
    finally:
        killer.join(30)
    assert wait_leader(ha, FAILOVER_WAIT_S, other_than=first) != first

    deadline, seed = time.monotonic() + FAILOVER_WAIT_S, 90
    while not carried(cluster, balancer, prompt_of(64, seed)):  # until they remounted
        assert time.monotonic() < deadline, "the pool carried no prompt after the failover"
        seed += 1
        time.sleep(0.5)

    cluster.restart(first)  # back as a standby: the lead stays where it went
    assert leader(ha) not in (None, first)
    assert faults.wait_idle(cluster) == dict.fromkeys(cluster.worker_names, 0)
