"""The whole system, as a user runs it: real Redis, mooncake_master, router and workers
(2 prefill + 2 decode on the tiny model), talked to with the official ``openai`` client.

As root with CAP_NET_ADMIN (CI), every process runs on its own network host, a network
namespace with its own address on a private bridge (:mod:`kvserve.cluster.netns`, as ``kvserve up
--hosts``), so that every connection, KV transfers through the pool included, crosses a
real network interface between distinct addresses; elsewhere everything runs on loopback
and the two tests that need separate hosts are skipped, saying why.

- every process lives on its own host and advertises its own address (root only);
- no worker and not the router listens on any address but its own (Mooncake's
  transfer-engine ports included: :mod:`kvpool.confine`);
- greedy outputs, streaming and not, equal the colocated in-process engine's and
  transformers' for prompts with and without a partial last block;
- a request sharing a long prefix with an earlier one, prefilled on the other prefill
  worker (host), takes the prefix from the pool (usage, /v1/cache/stats and /metrics say
  so) and computes only the rest;
- a stream cancelled mid-way gives every page back on every worker;
- an outsider without the cluster secret (from the test's own host, across the network)
  is refused by every worker's gRPC and by Redis, and a record it forges (even holding the
  Redis password) is not believed; the cluster keeps serving;
- cache salts keep tenants apart;
- the decode host serving a stream is cut off (link down) mid-load: every request
  completes with its fault-free output on the other decode host; with the link back, the
  host rejoins and nothing is held (root only);
- teardown removes every namespace and link.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import openai
import pytest
import redis

from kvserve.chaos.load import ChaosRequest
from kvserve.chaos.verify import TieChecker
from kvserve.cluster import faults
from kvserve.cluster.launch import Cluster
from kvserve.cluster.netns import NetHosts, unavailable
from proto import worker_pb2 as pb
from proto import worker_pb2_grpc
from proto.channels import sync_channel
from proto.grpc_auth import ROUTER
from proto.registry import Keys, connect, list_workers, seal_record
from tests.integration.pool_member import listening, listening_on
from tests.integration.reference import hf_greedy
from tests.midstream import FAULT_STREAM, complete, fault_mid_stream
from tests.tiny_cluster import (
    BLOCK,
    FAST_FAULT_ROUTER,
    FAST_FAULT_WORKER,
    MODEL_NAME,
    cluster_client,
    prompt_of,
    tiny_cluster_spec,
)
from workers.config import EngineConfig
from workers.core.sequence import SamplingParams
from workers.engine.engine import Engine

pytestmark = pytest.mark.kv_path

SUBNET = "203.0.113.0/24"  # TEST-NET-3; `kvserve up --hosts` defaults to TEST-NET-2
NO_HOSTS = unavailable()  # '' as root with CAP_NET_ADMIN, as in CI
needs_hosts = pytest.mark.skipif(bool(NO_HOSTS), reason=f"no separate hosts here: {NO_HOSTS}")


@pytest.fixture(scope="module")
def net_cluster(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[NetHosts | None, Cluster]]:
    spec = tiny_cluster_spec(
        tiny_model_dir,
        tmp_path_factory.mktemp("cluster"),
        prefill=2,
        decode=2,
        policy="round_robin",
        router_args=FAST_FAULT_ROUTER,
        worker_args=FAST_FAULT_WORKER,
    )
    tag = f"kvt{os.getpid() % 100000}"
    net = None if NO_HOSTS else NetHosts.for_spec(spec, SUBNET, tag)
    hosts = net.made() if net else contextlib.nullcontext()
    with hosts, Cluster(net.place(spec) if net else spec) as cluster:
        yield net, cluster
    if net is not None:
        assert net.existing() == []  # namespaces, veths and the bridge are gone


@pytest.fixture(scope="module")
def cluster(net_cluster: tuple[NetHosts | None, Cluster]) -> Cluster:
    return net_cluster[1]


@pytest.fixture(scope="module")
def client(cluster: Cluster) -> openai.OpenAI:
    return cluster_client(cluster)


def pool_tokens(cluster: Cluster) -> float:
    """Prompt tokens the pool supplied, as the router counts them."""
    by_source = "vllm:prompt_tokens_by_source_total"
    return faults.router_metric(cluster, by_source, source="external_kv_transfer")


def netns_of(pid: int | str | None) -> str:
    return str(Path(f"/proc/{pid}/ns/net").readlink())


@needs_hosts
def test_every_process_has_its_own_host(net_cluster: tuple[NetHosts | None, Cluster]) -> None:
    net, cluster = net_cluster
    assert net is not None
    names = cluster.spec.process_names()
    namespaces = {netns_of(cluster.process(n).pid) for n in names}
    assert len(namespaces) == len(names)
    assert netns_of("self") not in namespaces
    registry = connect(cluster.cluster_config)
    try:
        records = list_workers(registry, cluster.cluster_config.keys)
    finally:
        registry.close()
    advertised = {r.worker_id: r.address for r in records}
    assert advertised == {n: f"{net.addresses[n]}:{cluster.plan_of(n).port}" for n in advertised}
    assert sorted(advertised) == sorted(cluster.worker_names)
    assert cluster.router_url.startswith(f"http://{net.addresses['router']}:")


def test_workers_and_the_router_listen_on_their_own_address_only(cluster: Cluster) -> None:
    """Every listening socket of every pool member (gRPC, metrics, HTTP and the transfer
    engine's) is bound to the member's own address, none to every interface."""
    for name in (*cluster.worker_names, "router"):
        own = cluster.plan_of(name).host
        found = listening(int(cluster.process(name).pid or 0))
        assert len(found) >= 3, (name, found)  # its own service and the transfer engine's
        assert set(found) <= {own, f"::ffff:{own}"}, (name, found)


@needs_hosts
def test_this_machine_reaches_no_workers_transfer_engine(cluster: Cluster) -> None:
    """Every local user connects to the hosts from this machine's address on their network;
    a worker's transfer-engine ports (what it listens on besides its gRPC and metrics)
    close such a connection at once (``pool_peers``: the workers' addresses only), where
    Mooncake alone would wait for a request (this probe sends none, so a port that serves
    it times out)."""
    for name in cluster.worker_names:
        plan = cluster.plan_of(name)
        ports = {port for _, port in listening_on(int(cluster.process(name).pid or 0))}
        engine = ports - {plan.port, plan.metrics_port}
        assert len(engine) >= 2, (name, ports)  # the handshake and data ports
        for port in engine:
            with socket.create_connection((plan.host, port), timeout=10) as sock:
                sock.settimeout(5)
                assert sock.recv(1) == b"", (name, port)


def test_an_outsider_without_the_secret_is_refused_and_changes_nothing(
    cluster: Cluster, client: openai.OpenAI
) -> None:
    config = cluster.cluster_config
    assert len(config.cluster_secret) >= 32  # the launcher made one up
    outsider = dataclasses.replace(config, cluster_secret="")
    for name in cluster.worker_names:
        with sync_channel(cluster.plan_of(name).address, outsider, identity=ROUTER) as ch:
            stub = worker_pb2_grpc.WorkerStub(ch)
            with pytest.raises(grpc.RpcError) as refused:
                stub.SetRole(pb.SetRoleRequest(role="prefill"), timeout=10)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert faults.load_of(cluster, name).role == cluster.plan_of(name).role
    with pytest.raises(redis.AuthenticationError):
        redis.Redis.from_url(config.redis_url, socket_timeout=10).ping()
    registry = connect(config)  # holds the Redis password, not the cluster secret
    try:
        real = list_workers(registry, config.keys)[0]
        fake = dataclasses.replace(real, worker_id="decode-9", load={"free_pages": 10**6})
        registry.set(
            Keys(config.cluster).worker("decode-9"), seal_record(Keys(config.cluster), fake)
        )
        listed = {r.worker_id for r in list_workers(registry, config.keys)}
        assert "decode-9" not in listed and listed == set(cluster.worker_names)
        assert completion_text(client, prompt_of(20, 77), 4, stream=False)
    finally:
        registry.delete(Keys(config.cluster).worker("decode-9"))
        registry.close()


def completion_text(client: openai.OpenAI, prompt: list[int], n: int, stream: bool) -> str:
    if not stream:
        out = client.completions.create(
            model=MODEL_NAME, prompt=prompt, max_tokens=n, temperature=0
        )
        return out.choices[0].text
    chunks = client.completions.create(
        model=MODEL_NAME, prompt=prompt, max_tokens=n, temperature=0, stream=True
    )
    return "".join(c.choices[0].text for c in chunks if c.choices)


def test_greedy_outputs_match_colocated_engine_and_transformers(
    client: openai.OpenAI, tiny_model_dir: Path
) -> None:
    prompts = [prompt_of(n, seed) for seed, n in enumerate((5, 16, 40, 71))]
    n = 12
    engine = Engine(EngineConfig(model=str(tiny_model_dir), block_tokens=BLOCK, num_kv_blocks=64))
    colocated = engine.generate(prompts, SamplingParams(max_tokens=n, temperature=0))
    for prompt, local in zip(prompts, colocated, strict=True):
        reference = hf_greedy(tiny_model_dir, prompt, n)[: len(local.output_token_ids)]
        assert local.output_token_ids == reference
        expected = engine.tokenizer.decode(reference)
        assert completion_text(client, prompt, n, stream=False) == expected
        assert completion_text(client, prompt, n, stream=True) == expected


def test_a_tiny_temperature_next_to_innocent_streams_hurts_no_one(
    client: openai.OpenAI, cluster: Cluster
) -> None:
    """A temperature of 1e-40 once made the sampler's probabilities NaN and ended every
    stream on the worker: now it is refused (400) while the streams beside it finish with
    exactly their normal text."""
    prompts = [prompt_of(n, 60 + i) for i, n in enumerate((24, 37))]
    n = 40
    expected = [completion_text(client, p, n, stream=False) for p in prompts]
    streams = [
        client.completions.create(
            model=MODEL_NAME, prompt=p, max_tokens=n, temperature=0, stream=True
        )
        for p in prompts
    ]
    texts = ["", ""]
    for i, chunk in enumerate(next(iter(s)) for s in streams):  # both are under way
        texts[i] += chunk.choices[0].text if chunk.choices else ""
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.completions.create(
            model=MODEL_NAME, prompt=prompts[0], max_tokens=n, temperature=1e-40, stream=True
        )
    for i, stream in enumerate(streams):
        texts[i] += "".join(c.choices[0].text for c in stream if c.choices)
    assert texts == expected
    assert faults.wait_idle(cluster) == dict.fromkeys(cluster.worker_names, 0)


def cache_stats(cluster: Cluster) -> dict[str, Any]:
    import json
    import urllib.request

    with urllib.request.urlopen(cluster.router_url + "/v1/cache/stats", timeout=10) as r:
        stats: dict[str, Any] = json.load(r)
    workers: dict[str, Any] = stats["since_start"]["workers"]
    return workers


def test_shared_prefix_from_the_pool_on_the_other_prefill_worker(
    client: openai.OpenAI, cluster: Cluster
) -> None:
    prefix = prompt_of(160, 42)
    first = client.completions.create(
        model=MODEL_NAME, prompt=[*prefix, 11, 12, 13], max_tokens=2, temperature=0
    )
    before = cache_stats(cluster)
    pool_before = pool_tokens(cluster)
    second = client.completions.create(
        model=MODEL_NAME, prompt=[*prefix, 21, 22, 23, 24], max_tokens=2, temperature=0
    )
    after = cache_stats(cluster)
    assert first.usage is not None and second.usage is not None
    details = second.usage.prompt_tokens_details
    assert details is not None and details.cached_tokens == len(prefix)  # 10 full blocks
    served = [w for w in after if w.startswith("prefill") and after[w] != before.get(w)]
    assert len(served) == 1, after
    worker = after[served[0]]
    was = before.get(served[0], {"pool_tokens": 0, "computed_tokens": 0, "local_tokens": 0})
    assert worker["pool_tokens"] - was["pool_tokens"] == len(prefix)
    assert worker["local_tokens"] == was["local_tokens"]
    assert worker["computed_tokens"] - was["computed_tokens"] == 4
    pool_after = pool_tokens(cluster)
    assert pool_after - pool_before == len(prefix)


def decoded_tokens(cluster: Cluster) -> int:
    """Output tokens the decode workers have produced so far."""
    decoders = [n for n in cluster.worker_names if cluster.plan_of(n).role == "decode"]
    return sum(faults.load_of(cluster, n).output_tokens for n in decoders)


def test_cancelled_stream_returns_every_page(client: openai.OpenAI, cluster: Cluster) -> None:
    before = decoded_tokens(cluster)
    stream = client.completions.create(
        model=MODEL_NAME, prompt=prompt_of(50, 7), max_tokens=1900, temperature=0, stream=True
    )
    received = 0
    for chunk in stream:
        received += bool(chunk.choices and chunk.choices[0].text)
        if received >= 3:
            break
    stream.close()
    assert faults.wait_idle(cluster, timeout=60) == dict.fromkeys(cluster.worker_names, 0)
    assert decoded_tokens(cluster) - before < 1900  # it stopped early: the abort reached it


def test_cache_salts_keep_tenants_apart(client: openai.OpenAI, tiny_model_dir: Path) -> None:
    """The same long prompt under two salts shares nothing, in any worker's cache or in
    the pool; under one salt it is reused; the output is the same either way."""
    prompt = prompt_of(96, 77)

    def run(salt: str) -> tuple[str, int]:
        out = client.completions.create(
            model=MODEL_NAME, prompt=prompt, max_tokens=4, temperature=0,
            extra_body={"cache_salt": salt},
        )  # fmt: skip
        details = out.usage.prompt_tokens_details if out.usage else None
        return out.choices[0].text, (details.cached_tokens or 0) if details else 0

    first, cached_first = run("tenant-a")
    again, cached_again = run("tenant-a")
    other, cached_other = run("tenant-b")
    assert cached_first == 0 and cached_again == (len(prompt) - 1) // BLOCK * BLOCK
    assert cached_other == 0
    assert first == again == other


def not_greedy(
    got: dict[int, str], expected: dict[int, str], prompts: list[list[int]], model_dir: Path
) -> dict[int, str]:
    """The answers that differ from the fault-free run and are not exact greedy answers up
    to floating-point ties either (:mod:`kvserve.chaos.verify`: requests batched
    differently may break a tie the other way), with the checker's verdict."""
    differ = [i for i in expected if got.get(i) != expected[i]]
    if not differ:
        return {}
    checker = TieChecker(model_dir, EngineConfig(model=str(model_dir), block_tokens=BLOCK))
    asked = {i: ChaosRequest(tuple(prompts[i]), FAULT_STREAM, False) for i in differ}
    verdicts = {i: checker.check(asked[i], got.get(i, "")) for i in differ}
    print(f"answers that differ from the fault-free run: {verdicts}", flush=True)
    return {i: f"{v}: got {got.get(i)!r}" for i, v in verdicts.items() if not v.exact}


@needs_hosts
def test_decode_host_cut_off_mid_load(
    client: openai.OpenAI, net_cluster: tuple[NetHosts | None, Cluster], tiny_model_dir: Path
) -> None:
    """While other requests run, the link of the decode host serving a stream goes down:
    every request completes with its fault-free output (or one that differs only through a
    floating-point tie, checked against the model); with the link back up, the host
    rejoins and no worker holds a page."""
    net, cluster = net_cluster
    assert net is not None
    prompts = [prompt_of(48, 20 + i) for i in range(4)]
    expected = {i: complete(client, p, FAULT_STREAM) for i, p in enumerate(prompts)}
    got: dict[int, str] = {}

    def background(i: int) -> None:
        got[i] = complete(client, prompts[i], FAULT_STREAM)

    decode = [n for n in cluster.worker_names if cluster.plan_of(n).role == "decode"]
    taken = sum(faults.load_of(cluster, n).requests for n in decode)
    load = [threading.Thread(target=background, args=(i,)) for i in range(1, len(prompts))]
    for thread in load:
        thread.start()
    # the load's requests reach their decode workers before the probe notes what each has
    # taken, so that the probe names the one serving the stream, not one serving the load
    deadline = time.monotonic() + 60
    while sum(faults.load_of(cluster, n).requests for n in decode) < taken + len(load):
        assert time.monotonic() < deadline, "the background load never reached the decoders"
        time.sleep(0.05)
    migrations = faults.router_metric(cluster, "kvserve:migrations_total")
    cut: list[str] = []

    def cut_off(name: str) -> None:
        net.link_down(name)
        cut.append(name)

    try:
        got[0], _ = fault_mid_stream(client, cluster, prompts[0], cut_off)
        for thread in load:
            thread.join(180)
    finally:
        for name in cut:
            net.link_up(name)
    assert set(got) == set(expected)
    assert not_greedy(got, expected, prompts, tiny_model_dir) == {}
    assert faults.router_metric(cluster, "kvserve:migrations_total") > migrations
    assert faults.wait_routable(cluster, timeout=60)
    assert faults.wait_idle(cluster, timeout=60) == dict.fromkeys(cluster.worker_names, 0)
