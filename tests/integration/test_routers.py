"""Two routers behind nginx (``kvserve up --routers 2``), real processes throughout:

- each router says who answered (``/v1/cache/stats``, ``/metrics``, a response header),
  also through the balancer;
- a burst placed through both routers at once on a decode worker with room for two
  requests: every answer exact, no error, no page left held (the worker's pages are the
  truth: a reservation it cannot hold is refused and waited for, never oversubscribed);
- the P:D controller runs on both, acts on one (its lease in Redis), and the lease moves
  when that router dies;
- a router killed while a stream runs through the other: the stream is untouched, new
  requests through the balancer reach the survivor, and the killed one, started again,
  serves again.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from kvserve.cluster import faults
from kvserve.cluster.launch import Cluster
from tests.midstream import LONG, complete, inject_when, stream_with_fault
from tests.tiny_cluster import client_at, prompt_of, tiny_cluster_spec

pytestmark = pytest.mark.kv_path

NEVER_MOVES = ("--controller-min-prefill", "1", "--controller-max-prefill", "1")
CONTROLLER = ("--controller", "--controller-interval-s", "0.5", *NEVER_MOVES)
LEASE_WAIT_S = 60.0


@pytest.fixture(scope="module")
def cluster(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    spec = tiny_cluster_spec(
        tiny_model_dir,
        tmp_path_factory.mktemp("cluster"),
        engine={"kv_cache_mib": 1},  # 32 pages of 16 tokens: two requests of the burst
        router_ports=(1, 2),  # with_free_ports replaces both
        router_args=CONTROLLER,
    )
    with Cluster(spec).start() as running:
        yield running


def get(url: str) -> tuple[dict[str, str], bytes]:
    with urllib.request.urlopen(url, timeout=10) as reply:
        return dict(reply.headers), reply.read()


def controller(cluster: Cluster, name: str) -> dict[str, Any]:
    _, body = get(cluster.routers.urls[name] + "/v1/controller")
    report: dict[str, Any] = json.loads(body)
    return report


def holder(cluster: Cluster, among: list[str]) -> str | None:
    """The router among ``among`` that says it holds the controller's lease (one at most)."""
    held = [n for n in among if controller(cluster, n)["lease"]["held_here"]]
    assert len(held) <= 1, held
    return held[0] if held else None


def test_each_router_says_who_answered(cluster: Cluster) -> None:
    names = cluster.routers.names
    assert names == ["router-0", "router-1"]
    for name, url in cluster.routers.urls.items():
        headers, body = get(url + "/v1/cache/stats")
        assert json.loads(body)["router"] == name and headers["X-Kvserve-Router"] == name
        _, metrics = get(url + "/metrics")
        assert f'kvserve:router_info{{router="{name}"}} 1.0' in metrics.decode()
    seen = set()
    for _ in range(4):  # round-robin: both answer through the balancer
        headers, body = get(cluster.router_url + "/v1/cache/stats")
        assert json.loads(body)["router"] == headers["X-Kvserve-Router"]
        assert headers["X-Kvserve-Upstream"] == cluster.routers.urls[
            headers["X-Kvserve-Router"]
        ].removeprefix("http://")
        seen.add(headers["X-Kvserve-Router"])
    assert seen == set(names)


def test_a_burst_through_both_routers_never_oversubscribes_the_decode_worker(
    cluster: Cluster,
) -> None:
    prompts = [prompt_of(200, 60 + i) for i in range(8)]  # 15 pages each with the output
    reference = [complete(client_at(cluster.router_url), p, 40) for p in prompts]
    clients = [client_at(url) for url in cluster.routers.urls.values()]
    with ThreadPoolExecutor(len(prompts)) as pool:
        answers = list(
            pool.map(lambda i: complete(clients[i % 2], prompts[i], 40), range(len(prompts)))
        )
    assert answers == reference
    assert faults.wait_idle(cluster) == dict.fromkeys(cluster.worker_names, 0)


def test_the_controller_acts_from_one_router_and_its_lease_moves_when_it_dies(
    cluster: Cluster,
) -> None:
    names = cluster.routers.names
    deadline = time.monotonic() + LEASE_WAIT_S
    while (first := holder(cluster, names)) is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert first is not None
    other = next(n for n in names if n != first)
    assert controller(cluster, other)["lease"]["holder"] == first
    faults.kill(cluster, first)
    try:
        while holder(cluster, [other]) is None and time.monotonic() < deadline + LEASE_WAIT_S:
            time.sleep(0.2)
        assert holder(cluster, [other]) == other
    finally:
        cluster.restart(first)
    assert holder(cluster, names) == other  # the survivor keeps it
    assert controller(cluster, first)["lease"]["holder"] == other


def test_a_router_killed_while_a_stream_runs_through_the_other(cluster: Cluster) -> None:
    survivor, doomed = cluster.routers.names
    prompt, short = prompt_of(40, 71), prompt_of(30, 72)
    balancer = client_at(cluster.router_url)
    reference, short_reference = complete(balancer, prompt, LONG), complete(balancer, short, 8)

    ready = threading.Event()
    killer = inject_when(ready, lambda: faults.kill(cluster, doomed))
    try:
        through = client_at(cluster.routers.urls[survivor])
        assert stream_with_fault(through, prompt, LONG, after=5, fault=ready) == reference
    finally:
        killer.join(30)
    assert not cluster.process(doomed).running
    for _ in range(4):  # every round-robin slot: the balancer passes them to the survivor
        assert complete(balancer, short, 8) == short_reference
    cluster.restart(doomed)
    assert complete(client_at(cluster.routers.urls[doomed]), short, 8) == short_reference
    assert faults.wait_idle(cluster) == dict.fromkeys(cluster.worker_names, 0)
