"""Faults with real processes (kill -9, SIGSTOP, master and Redis restarts) on a whole
cluster (1 prefill + 2 decode workers on the tiny model, real Redis and mooncake_master),
talked to with the official ``openai`` client. Every test asserts that nothing hangs (each
wait is bounded), that a request which succeeds returns exactly the fault-free greedy
output, and that every worker holds zero pages once idle.
"""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import openai
import pytest

from kvpool.config import PoolConfig
from kvserve import faults
from kvserve.cluster import Cluster, ClusterSpec
from proto.registry import ClusterConfig, Keys, connect, list_workers
from workers.config import EngineConfig

BLOCK = 16
MODEL_NAME = "tiny-llama"
LONG = 300  # output tokens: long enough that a fault lands mid-stream on the tiny model
PEER_TIMEOUT = ("--peer-timeout-s", "2")  # a frozen peer fails its calls within ~2 s


@pytest.fixture(scope="module")
def cluster(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    spec = ClusterSpec(
        prefill=1,
        decode=2,
        engine=EngineConfig(
            model=str(tiny_model_dir), block_tokens=BLOCK, kv_cache_mib=16, threads=1
        ),
        pool=PoolConfig(pool_segment_mib=64, pool_local_buffer_mib=16),
        policy="round_robin",
        disagg_threshold_tokens=0,
        router_args=PEER_TIMEOUT,
        worker_args=PEER_TIMEOUT,
        pin_cores=False,
        threads_per_worker=1,
        log_dir=tmp_path_factory.mktemp("faults"),
        startup_timeout_s=180,
    ).with_free_ports()
    with Cluster(spec).start() as running:
        yield running


@pytest.fixture(scope="module")
def client(cluster: Cluster) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=cluster.router_url + "/v1", api_key="unused", max_retries=0, timeout=120
    )


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


def metric(cluster: Cluster, name: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(cluster.router_url + "/metrics", timeout=10) as reply:
        text = reply.read().decode()
    return sum(
        s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name
    )


def prompt_of(length: int, seed: int) -> list[int]:
    return [(seed * 7919 + i * 104729) % 49000 + 100 for i in range(length)]


def complete(client: openai.OpenAI, prompt: list[int], n: int) -> str:
    out = client.completions.create(
        model=MODEL_NAME,
        prompt=prompt,
        max_tokens=n,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    return out.choices[0].text


def stream_with_fault(
    client: openai.OpenAI, prompt: list[int], n: int, after: int, fault: threading.Event
) -> str:
    """Stream a greedy completion; set ``fault`` once ``after`` chunks have come and wait
    for the fault to be injected before reading on."""
    chunks = client.completions.create(
        model=MODEL_NAME,
        prompt=prompt,
        max_tokens=n,
        temperature=0,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    parts: list[str] = []
    for i, chunk in enumerate(chunks):
        parts.append(chunk.choices[0].text if chunk.choices else "")
        if i == after:
            fault.set()
    return "".join(parts)


def inject_when(ready: threading.Event, action: object) -> threading.Thread:
    def run() -> None:
        assert ready.wait(60)
        action()  # type: ignore[operator]

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def fault_mid_stream(
    client: openai.OpenAI, cluster: Cluster, prompt: list[int], fault: Callable[[str], None]
) -> tuple[str, str]:
    """Stream ``prompt``; after a few chunks apply ``fault`` to the decode worker serving
    it; returns the text the client got and that worker's name."""
    hit: list[str] = []

    def on_serving_decoder() -> None:
        name = faults.serving_worker(cluster, "decode")
        assert name is not None, "the stream ended before the fault"
        fault(name)
        hit.append(name)

    ready = threading.Event()
    thread = inject_when(ready, on_serving_decoder)
    try:
        text = stream_with_fault(client, prompt, LONG, after=5, fault=ready)
    finally:
        thread.join(30)
    assert hit, "no fault was injected"
    return text, hit[0]


def test_decode_worker_frozen_or_killed_mid_stream(client: openai.OpenAI, cluster: Cluster) -> None:
    """A frozen (SIGSTOP) and then a killed decode worker: each time the stream resumes on
    the other one with exactly the fault-free output; with no decode worker left, the
    stream ends with an error event."""
    prompt = prompt_of(40, 1)
    reference = complete(client, prompt, LONG)
    migrations = metric(cluster, "kvserve_migrations_total")
    got, frozen = fault_mid_stream(
        client, cluster, prompt, lambda name: faults.freeze(cluster, name)
    )
    faults.thaw(cluster, frozen)
    assert got == reference
    assert faults.wait_idle(cluster, [frozen]) == {frozen: 0}  # its stream was aborted
    assert faults.wait_routable(cluster)
    got, killed = fault_mid_stream(client, cluster, prompt, lambda name: faults.kill(cluster, name))
    assert got == reference
    assert metric(cluster, "kvserve_migrations_total") == migrations + 2
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
        faults.load_of(cluster.plan_of(n).address).kv_bytes_read
        for n in cluster.worker_names
        if n.startswith("decode")
    )


def pool_connected(cluster: Cluster) -> list[bool]:
    return [faults.load_of(cluster.plan_of(n).address).pool_connected for n in cluster.worker_names]


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
    client = connect(ClusterConfig(redis_url=cluster.redis_url))
    try:
        return {r.worker_id for r in list_workers(client, Keys())}
    finally:
        client.close()


def test_redis_outage_and_empty_restart(client: openai.OpenAI, cluster: Cluster) -> None:
    prompt = prompt_of(30, 5)
    reference = complete(client, prompt, 8)
    faults.kill(cluster, "redis")
    time.sleep(cluster.spec.heartbeat_ttl_s + 1)  # every registry record would be stale now
    assert complete(client, prompt, 8) == reference  # served on workers heard from directly
    cluster.restart("redis")  # empty: nothing is persisted
    deadline = time.monotonic() + 10 * cluster.spec.heartbeat_s
    while registered(cluster) != set(cluster.worker_names):
        assert time.monotonic() < deadline, "workers did not re-register"
        time.sleep(0.1)
    assert complete(client, prompt, 8) == reference
