"""The router does not believe the registry blindly (issue 17, finding 3).

One real one-machine cluster (Redis with its password, the router, one mixed worker on the
tiny model, no pool, a cluster secret) serves while the tests write to Redis what anyone
with access to Redis but without the secret could: a forged worker record with a huge
number of free pages (at a spy's address, which must never be called), a real record with
``max_model_len=1`` (in place, and replayed under another key), an overwritten contract,
records out of the schema and values that are no records at all. Each time the refused
values are counted in the router's ``/metrics``, the real worker stays registered and
requests succeed. Which poll of the router saw a planted value is known from Redis's own
count of MGET calls (the router's poll is the only MGET), never from sleeping.

A second, in-process router on stub workers (:mod:`tests.integration.router_harness`, its
own Redis) shows that a record's ``model_dir`` never becomes the tokenizer's path.
"""

from __future__ import annotations

import dataclasses
import json
import re
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
import openai
import pytest
import redis

from kvserve.cluster.launch import Cluster
from proto.record_store import open_contract, seal_contract, seal_fields
from proto.registry import (
    ContractMismatchError,
    Keys,
    claim_contract,
    connect,
    list_workers,
)
from proto.tokenization import Tokenizer
from router.flow import tokenizer as tokenizer_module
from tests.integration.router_harness import MODEL, Harness, StubWorker, running_redis
from tests.tiny_cluster import MODEL_NAME, cluster_client, prompt_of, tiny_cluster_spec

if TYPE_CHECKING:  # generic in the stubs only
    RpcHandler = grpc.GenericRpcHandler[object, object]
else:
    RpcHandler = grpc.GenericRpcHandler

WAIT_S = 30.0
PLANTED_TTL_MS = 120_000


@pytest.fixture(scope="module")
def cluster(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    spec = tiny_cluster_spec(
        tiny_model_dir, tmp_path_factory.mktemp("cluster"), prefill=0, decode=0, mixed=1,
        use_pool=False, engine={"attention": "torch"},  # no C++ kernels to build here
    )  # fmt: skip
    assert spec.cluster_config.cluster_secret, "the launcher gives every cluster a secret"
    with Cluster(spec).start() as running:
        yield running


@pytest.fixture
def registry(cluster: Cluster) -> Iterator[redis.Redis]:
    """An admin client of the cluster's Redis; what a test planted under the workers' keys
    is removed afterwards."""
    client = connect(cluster.cluster_config, socket_timeout=10)
    keys = cluster.cluster_config.keys
    real = {keys.worker(n).encode() for n in cluster.worker_names}
    try:
        yield client
    finally:
        planted = [k for k in client.scan_iter(match=keys.workers_pattern) if k not in real]
        if planted:
            client.delete(*planted)
        client.close()


def wait_until(what: str, ready: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not ready():
        assert time.monotonic() < deadline, f"never saw {what} within {WAIT_S:g} s"
        time.sleep(0.05)


def mget_calls(registry: redis.Redis) -> int:
    stats = registry.info("commandstats").get("cmdstat_mget", {})
    return int(stats.get("calls", 0))


def polled(registry: redis.Redis, polls: int = 2) -> None:
    """Return once the router has started ``polls`` more registry reads: at least one
    whole poll then read what is in Redis now."""
    start = mget_calls(registry)
    wait_until(f"{polls} router polls", lambda: mget_calls(registry) >= start + polls)


def rejected(cluster: Cluster, reason: str) -> float:
    """The router's count of registry values refused for ``reason``."""
    with urllib.request.urlopen(cluster.router_url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    pattern = rf'kvserve:registry_rejected_records_total\{{reason="{reason}"\}} (\S+)'
    found = re.search(pattern, text)
    return float(found.group(1)) if found else 0.0


def serves(cluster: Cluster, requests: int = 2) -> None:
    """``requests`` completions succeed, each with its tokens."""
    client = cluster_client(cluster)
    for seed in range(requests):
        out = client.completions.create(
            model=MODEL_NAME, prompt=prompt_of(24, seed + uuid.uuid4().int % 1000), max_tokens=3
        )
        assert out.usage is not None and out.usage.completion_tokens == 3


def real_record(cluster: Cluster, registry: redis.Redis) -> tuple[str, dict[str, object]]:
    """The real worker's key and stored record (its fields and its MAC, as stored)."""
    name = cluster.cluster_config.keys.worker(cluster.worker_names[0])
    raw = registry.get(name)
    assert raw is not None
    return name, json.loads(raw)


def listed(cluster: Cluster, registry: redis.Redis) -> list[str]:
    return [r.worker_id for r in list_workers(registry, cluster.cluster_config.keys)]


class Spy(RpcHandler):
    """A gRPC server that records every call it gets and answers none of them."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.server = grpc.server(ThreadPoolExecutor(2), handlers=[self])
        self.address = f"127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"
        self.server.start()

    def service(self, details: grpc.HandlerCallDetails) -> None:
        self.calls.append(str(details.method))

    def stop(self) -> None:
        self.server.stop(None)


def test_a_forged_record_gets_no_request(cluster: Cluster, registry: redis.Redis) -> None:
    _, stored = real_record(cluster, registry)
    keys = cluster.cluster_config.keys
    other_secret = dataclasses.replace(keys, record_key=b"\x01" * 32)
    spy = Spy()
    try:
        for name, keyed in (("aa-unsigned", None), ("aa-other-secret", other_secret)):
            fields = {k: v for k, v in stored.items() if k != "mac"}
            load = {"role": "decode", "free_pages": 10**6, "total_pages": 10**6}
            fields.update(worker_id=name, address=spy.address, role="decode", load=load)
            key = keys.worker(name)
            value = json.dumps(fields) if keyed is None else seal_fields(keyed, key, fields)
            registry.set(key, value, px=PLANTED_TTL_MS)
        before = rejected(cluster, "mac")
        polled(registry)
        serves(cluster, requests=3)
        assert spy.calls == []
        assert rejected(cluster, "mac") >= before + 2
        assert listed(cluster, registry) == cluster.worker_names
    finally:
        spy.stop()


def test_a_record_put_back_from_long_ago_gets_no_request(
    cluster: Cluster, registry: redis.Redis
) -> None:
    """A record a worker really wrote (sealed with the secret) ten minutes ago, of a worker
    that has left, put back without a TTL by a writer of Redis: the router refuses it as
    stale (its heartbeat is past the liveness window) and never calls its address."""
    _, stored = real_record(cluster, registry)
    keys = cluster.cluster_config.keys
    spy = Spy()
    try:
        fields = {k: v for k, v in stored.items() if k != "mac"}
        load = {"role": "decode", "free_pages": 10**6, "total_pages": 10**6}
        old = time.time() - 600
        fields.update(worker_id="aa-departed", address=spy.address, role="decode", load=load,
                      started_at=old - 60, heartbeat_at=old)  # fmt: skip
        key = keys.worker("aa-departed")
        registry.set(key, seal_fields(keys, key, fields))  # no TTL: it stays
        before = rejected(cluster, "stale")
        polled(registry)
        serves(cluster, requests=3)
        assert spy.calls == []
        assert rejected(cluster, "stale") >= before + 1
        assert "aa-departed" in listed(cluster, registry)  # authentic: only its age refuses it
    finally:
        spy.stop()


def test_a_tampered_record_is_refused(cluster: Cluster, registry: redis.Redis) -> None:
    name, stored = real_record(cluster, registry)
    keys = cluster.cluster_config.keys
    # replayed under another key (as its own worker id), max_model_len=1: stays in Redis
    copy = {**stored, "worker_id": "aa-copy", "max_model_len": 1}
    registry.set(keys.worker("aa-copy"), json.dumps(copy), px=PLANTED_TTL_MS)
    polled(registry)
    serves(cluster)
    registry.delete(keys.worker("aa-copy"))
    polled(registry)
    # changed in place: the worker's next beat rewrites it, so rewrite it faster than that
    before = rejected(cluster, "mac")
    done = threading.Event()

    def tamper() -> None:
        tampered = json.dumps({**stored, "max_model_len": 1})
        while not done.wait(0.01):
            registry.set(name, tampered, px=3000)

    writer = threading.Thread(target=tamper, daemon=True)
    writer.start()
    try:
        wait_until("the in-place change refused", lambda: rejected(cluster, "mac") > before + 1)
    finally:
        done.set()
        writer.join(10)
    worker = cluster.worker_names[0]
    wait_until("the worker's own record back", lambda: worker in listed(cluster, registry))
    serves(cluster)


@pytest.mark.parametrize("sealed", [False, True], ids=["plain", "sealed-without-the-secret"])
def test_an_overwritten_contract_does_not_empty_the_cluster(
    cluster: Cluster, registry: redis.Redis, sealed: bool
) -> None:
    keys = cluster.cluster_config.keys
    contract = str(real_record(cluster, registry)[1]["contract"])
    forged = seal_contract(Keys(keys.cluster), "kvs1|other") if sealed else "kvs1|other"
    registry.set(keys.contract, forged, px=PLANTED_TTL_MS)
    after = time.time() + 0.5
    wait_until("a heartbeat after the overwrite", lambda: beat_at(cluster, registry) > after)
    wait_until("the worker's contract back", lambda: _contract(registry, keys) == contract)
    assert listed(cluster, registry) == cluster.worker_names
    serves(cluster, requests=1)


def beat_at(cluster: Cluster, registry: redis.Redis) -> float:
    """When the real worker's stored record says it last beat (0: no record)."""
    raw = registry.get(cluster.cluster_config.keys.worker(cluster.worker_names[0]))
    return 0.0 if raw is None else float(json.loads(raw)["heartbeat_at"])


def _contract(registry: redis.Redis, keys: Keys) -> str | None:
    raw = registry.get(keys.contract)
    return None if raw is None else open_contract(keys, raw)


def test_an_authentic_other_contract_still_refuses_a_worker(
    cluster: Cluster, registry: redis.Redis
) -> None:
    """Against the same Redis, under a cluster name of its own."""
    keys = dataclasses.replace(cluster.cluster_config.keys, cluster=f"t{uuid.uuid4().hex[:8]}")
    try:
        claim_contract(registry, keys, "kvs1|model-a", 30)
        claim_contract(registry, keys, "kvs1|model-a", 30)  # ours: refreshed
        with pytest.raises(ContractMismatchError, match="differs"):
            claim_contract(registry, keys, "kvs1|model-b", 30)
        registry.set(keys.contract, "kvs1|model-c")  # no MAC: replaced, not believed
        claim_contract(registry, keys, "kvs1|model-b", 30)
        assert _contract(registry, keys) == "kvs1|model-b"
    finally:
        registry.delete(keys.contract)


def test_malformed_records_are_skipped(cluster: Cluster, registry: redis.Redis) -> None:
    _, stored = real_record(cluster, registry)
    keys = cluster.cluster_config.keys
    fields = {k: v for k, v in stored.items() if k != "mac"}
    authentic: dict[
        str, dict[str, object]
    ] = {  # MACed with the cluster's secret, yet out of the schema
        "zz-type": {"max_model_len": "2048"},
        "zz-huge": {"model_dir": "/m" * 20_000},
        "zz-port": {"address": "127.0.0.1:0"},
        "zz-host": {"address": "evil host:1"},
        "zz-load": {"load": {"free_pages": -5}},
    }
    for name, change in authentic.items():
        record = {**fields, "worker_id": name, **change}
        registry.set(keys.worker(name), seal_fields(keys, keys.worker(name), record),
                     px=PLANTED_TTL_MS)  # fmt: skip
    junk = {"zz-binary": b"\xff\x00", "zz-array": b"[1]", "zz-big": b"{" * 100_000}
    for name, value in junk.items():
        registry.set(keys.worker(name), value, px=PLANTED_TTL_MS)
    before = rejected(cluster, "invalid")
    polled(registry)
    serves(cluster)
    assert rejected(cluster, "invalid") >= before + len(authentic) + len(junk)
    assert listed(cluster, registry) == cluster.worker_names


def test_a_record_never_names_the_tokenizer(
    tiny_model_dir: Path, default_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Records name ``default_model_dir`` (a real tokenizer): without ``tokenizer_dir`` the
    router loads none and refuses requests with the setting named; with one it loads that
    directory only."""
    loaded: list[Path] = []

    def recording(model_dir: Path) -> Tokenizer:
        loaded.append(model_dir)
        return Tokenizer(model_dir)

    monkeypatch.setattr(tokenizer_module, "Tokenizer", recording)
    stubs = [StubWorker("d1", "decode")]
    with running_redis(tmp_path) as url:
        with Harness(url, default_model_dir, stubs, {"tokenizer_dir": ""}) as h:
            with pytest.raises(openai.APIStatusError) as refused:
                h.client().completions.create(model=MODEL, prompt="hello", max_tokens=2)
            assert refused.value.status_code == 503 and "--tokenizer-dir" in str(refused.value)
            assert loaded == []
        options = {"tokenizer_dir": str(tiny_model_dir)}
        with Harness(url, default_model_dir, stubs, options) as h:
            out = h.client().completions.create(model=MODEL, prompt="hello", max_tokens=2)
            assert out.choices[0].text and loaded == [tiny_model_dir]
