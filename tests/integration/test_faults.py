"""Faults with real processes (kill -9, SIGSTOP, master and Redis restarts) on a whole
cluster (1 prefill + 2 decode workers on the tiny model, real Redis and mooncake_master),
talked to with the official ``openai`` client. Every test asserts that nothing hangs (each
wait is bounded), that a request which succeeds returns exactly the fault-free greedy
output, and that every worker holds zero pages once idle.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from kvserve.cluster import faults
from kvserve.cluster.launch import Cluster
from proto.registry import connect, list_workers
from tests.midstream import FAULT_STREAM, complete, fault_mid_stream
from tests.tiny_cluster import (
    FAST_FAULT_ROUTER,
    FAST_FAULT_WORKER,
    cluster_client,
    prompt_of,
    tiny_cluster_spec,
)

pytestmark = pytest.mark.kv_path


@pytest.fixture(scope="module")
def cluster(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    spec = tiny_cluster_spec(
        tiny_model_dir,
        tmp_path_factory.mktemp("faults"),
        decode=2,
        policy="round_robin",
        router_args=FAST_FAULT_ROUTER,
        worker_args=FAST_FAULT_WORKER,
    )
    with Cluster(spec).start() as running:
        yield running


@pytest.fixture(scope="module")
def client(cluster: Cluster) -> openai.OpenAI:
    """The cluster's client, once every decode worker has served a request: a worker's
    first request also loads what later ones reuse, and a probe that must find the worker
    serving a stream while it decodes (:func:`tests.midstream.fault_mid_stream`) once saw
    a cold one answer it only after the stream had ended."""
    client = cluster_client(cluster)
    decode = [n for n in cluster.worker_names if cluster.plan_of(n).role == "decode"]
    for i in range(len(decode)):  # round robin: one request to each decode worker
        complete(client, prompt_of(40, 900 + i), 2)
    return client


@pytest.fixture(autouse=True)
def whole_cluster_after(cluster: Cluster) -> Iterator[None]:
    """Each test starts with every process running, and leaves nothing held."""
    yield
    dead = cluster.dead()
    for service in ("mooncake_master", "redis"):
        if service in dead:
            cluster.restart(service)
    cluster.restart_workers([n for n in dead if n in cluster.worker_names])
    assert faults.wait_routable(cluster)
    assert faults.wait_idle(cluster) == dict.fromkeys(cluster.worker_names, 0)


def test_decode_worker_frozen_or_killed_mid_stream(client: openai.OpenAI, cluster: Cluster) -> None:
    """A frozen (SIGSTOP) and then a killed decode worker: each time the stream resumes on
    the other one with exactly the fault-free output; with no decode worker left, the
    stream ends with an error event."""
    prompt = prompt_of(40, 1)
    reference = complete(client, prompt, FAULT_STREAM)
    migrations = faults.router_metric(cluster, "kvserve:migrations_total")
    got, frozen = fault_mid_stream(
        client, cluster, prompt, lambda name: faults.freeze(cluster, name)
    )
    faults.thaw(cluster, frozen)
    assert got == reference
    assert faults.wait_idle(cluster, [frozen]) == {frozen: 0}  # its stream was aborted
    assert faults.wait_routable(cluster)
    got, killed = fault_mid_stream(client, cluster, prompt, lambda name: faults.kill(cluster, name))
    assert got == reference
    assert faults.router_metric(cluster, "kvserve:migrations_total") == migrations + 2
    last = [n for n in cluster.worker_names if n.startswith("decode") and n != killed]
    assert faults.wait_idle(cluster, last) == {last[0]: 0}
    with pytest.raises(openai.APIError):
        fault_mid_stream(client, cluster, prompt, lambda name: faults.kill(cluster, name))


def test_prefill_worker_killed_mid_prefill_is_rerouted(
    client: openai.OpenAI, cluster: Cluster
) -> None:
    prompt = prompt_of(200, 3)
    reference = complete(client, prompt, 8)
    faults.freeze(cluster, "prefill-0")  # the call lands, and stays, on a hung worker...
    timer = threading.Timer(1.0, faults.kill, (cluster, "prefill-0"))  # ...which then dies
    timer.start()
    try:
        assert complete(client, [*prompt], 8) == reference
    finally:
        timer.join()


def pool_reads(cluster: Cluster) -> int:
    """KV bytes the decode workers have read from the pool so far."""
    return sum(
        faults.load_of(cluster, n).kv_bytes_read
        for n in cluster.worker_names
        if n.startswith("decode")
    )


def pool_connected(cluster: Cluster) -> list[bool]:
    return [faults.load_of(cluster, n).pool_connected for n in cluster.worker_names]


def test_pool_master_restart_keeps_serving_then_reuses_the_pool(
    client: openai.OpenAI, cluster: Cluster
) -> None:
    prompts = [prompt_of(60, 10 + i) for i in range(3)]
    references = [complete(client, p, 8) for p in prompts]
    faults.kill(cluster, "mooncake_master")
    assert [complete(client, p, 8) for p in prompts] == references  # recomputed
    assert not any(pool_connected(cluster))
    cluster.restart("mooncake_master")
    deadline = time.monotonic() + 30
    while not all(pool_connected(cluster)):
        assert time.monotonic() < deadline, "the workers did not use the pool again in 30 s"
        complete(client, prompts[0], 2)
        time.sleep(0.2)
    before = pool_reads(cluster)
    assert [complete(client, p, 8) for p in prompts] == references
    assert pool_reads(cluster) > before  # the decode side pulled prompts from the pool again


def registered(cluster: Cluster) -> set[str]:
    client = connect(cluster.cluster_config)
    try:
        return {r.worker_id for r in list_workers(client, cluster.cluster_config.keys)}
    finally:
        client.close()


def test_redis_outage_and_empty_restart(client: openai.OpenAI, cluster: Cluster) -> None:
    prompt = prompt_of(30, 5)
    reference = complete(client, prompt, 8)
    faults.kill(cluster, "redis")
    time.sleep(cluster.spec.cluster.heartbeat_ttl_s + 1)  # every registry record would be stale now
    assert complete(client, prompt, 8) == reference  # served on workers heard from directly
    cluster.restart("redis")  # empty: nothing is persisted
    deadline = time.monotonic() + 10 * cluster.spec.cluster.heartbeat_s
    while registered(cluster) != set(cluster.worker_names):
        assert time.monotonic() < deadline, "workers did not re-register"
        time.sleep(0.1)
    assert complete(client, prompt, 8) == reference
