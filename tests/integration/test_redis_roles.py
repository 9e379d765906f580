"""Each role's Redis user (:mod:`kvserve.cluster.redis_acl`) against a real ``redis-server``
started the way ``kvserve up`` starts it: every role can do what its code does, through the
same functions the processes call (the registry, the KV-event stream, the controller lease,
the chain index), and nothing else: no ``FLUSHALL``, ``CONFIG``, ``ACL`` or ``KEYS``, and no
key of another role or of another cluster. The administrator (the configured password) keeps
every command."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from kvpool.chain_index import ChainIndex, Link
from kvpool.net import free_local_ports
from kvserve.cluster.processes import ManagedProcess, Readiness
from kvserve.cluster.redis import RedisConfig, RedisProcess, answers_ping, redis_binary
from kvserve.cluster.redis_acl import EXPORTER, ROUTER, WORKER, as_role, role_password
from proto.kv_events import EventBatch
from proto.kv_stream import (
    publish_batch,
    read_batches,
    request_snapshot,
    stream_name,
    take_snapshot_request,
)
from proto.registry import ClusterConfig, WorkerRecord, connect, list_workers, publish, withdraw
from proto.trust import new_secret
from router.control.lease import ControllerLease
from tests.redis_logins import refused
from tests.unit.compose_files import init_secrets

CLUSTER = "acl"
KINDS = ("username", "password")
PASSWORD = "admin password " + new_secret()[:16]

FORBIDDEN_TO_ALL: tuple[tuple[Any, ...], ...] = (
    ("FLUSHALL",),
    ("FLUSHDB",),
    ("CONFIG", "GET", "requirepass"),
    ("CONFIG", "SET", "maxmemory", "1"),
    ("ACL", "LIST"),
    ("ACL", "SETUSER", "evil", "on", ">x", "+@all", "~*"),
    ("KEYS", "*"),
    ("SHUTDOWN", "NOSAVE"),
    ("SET", "elsewhere:x", "1"),
    ("GET", "other:worker:w"),
    ("SCRIPT", "FLUSH"),
    ("SAVE",),
)
"""Commands no role may run: the issue's FLUSHALL and CONFIG, and what would let a role
read every command, rewrite the users, stop Redis or reach another cluster's keys."""

FORBIDDEN: dict[str, tuple[tuple[Any, ...], ...]] = {
    ROUTER: (  # it reads what workers write, never writes it
        ("SET", f"{CLUSTER}:worker:w9", "forged"),
        ("DEL", f"{CLUSTER}:contract"),
        ("XADD", f"{CLUSTER}:kv-events", "*", "b", "forged"),
        ("HSET", f"{{{CLUSTER}:pool}}:parent", "b", ""),
        ("EVAL", "return redis.call('DEL', KEYS[1])", "1", f"{CLUSTER}:worker:w1"),
    ),
    WORKER: (  # it cannot take the controller's lease or ask for another's snapshot
        ("SET", f"{CLUSTER}:controller", "me"),
        ("SET", f"{CLUSTER}:kv-events:want:w2", "1"),
        ("XREAD", "STREAMS", f"{CLUSTER}:kv-events", "0-0"),
        ("EVAL", "return redis.call('SET', KEYS[1], 'me')", "1", f"{CLUSTER}:controller"),
    ),
    EXPORTER: (
        ("GET", f"{CLUSTER}:contract"),
        ("SCAN", "0"),
        ("SET", f"{CLUSTER}:worker:w9", "forged"),
    ),
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisProcess]:
    (port,) = free_local_ports(1)
    log = tmp_path_factory.mktemp("redis-roles") / "redis.log"
    cfg = RedisConfig(port=port, password=PASSWORD, cluster=CLUSTER)
    with RedisProcess(cfg, log) as running:
        yield running


def settings(server: RedisProcess) -> ClusterConfig:
    """The administrator's settings of cluster :data:`CLUSTER` (a secret for its MACs)."""
    return dataclasses.replace(server.cluster_config, cluster=CLUSTER, cluster_secret=new_secret())


def client_of(cluster: ClusterConfig, role: str) -> redis.Redis:
    return connect(as_role(cluster, role), socket_timeout=5, socket_connect_timeout=5)


def record(worker_id: str) -> WorkerRecord:
    now = time.time()
    return WorkerRecord(worker_id, "127.0.0.1:1", "decode", "m", "/m", "c", 16, 2, 64, now, now)


def test_each_role_does_what_its_code_does(server: RedisProcess) -> None:
    cluster = settings(server)
    keys = cluster.keys
    worker, router = client_of(cluster, WORKER), client_of(cluster, ROUTER)
    try:
        publish(worker, keys, record("w1"), 30.0)  # the record and the contract
        assert [r.worker_id for r in list_workers(router, keys)] == ["w1"]
        publish_batch(worker, keys, EventBatch("w1", 1.0, 0))
        assert [b.worker_id for _, b in read_batches(router, keys).batches] == ["w1"]
        assert router.xrevrange(stream_name(keys), count=1)  # where the router's index starts
        request_snapshot(router, keys, "w1", 30.0)
        assert take_snapshot_request(worker, keys, "w1")
        index = ChainIndex(worker, f"{CLUSTER}:pool")  # the prefill side's writes, evictions
        index.claim([Link("b1", "", 10), Link("b2", "b1", 10)])
        assert index.settle(["b1", "b2"], []) == []
        index.bury(["b2"])
        assert index.parent_of("b1") == ""
        stats = ChainIndex(router, f"{CLUSTER}:pool").stats()  # the router's status page
        assert stats.blocks == len(index.blocks()) > 0
        lease = ControllerLease(as_role(cluster, ROUTER), "r1", 5.0)
        try:
            assert lease.take() and lease.take() and lease.look() == "r1" and lease.release()
        finally:
            lease.close()
        withdraw(worker, keys, "w1")
        assert list_workers(router, keys) == []
    finally:
        worker.close()
        router.close()


def test_the_exporter_reads_statistics_only(server: RedisProcess) -> None:
    exporter = client_of(settings(server), EXPORTER)
    try:
        assert "redis_version" in exporter.info()
        assert isinstance(exporter.slowlog_get(), list) and exporter.dbsize() >= 0
    finally:
        exporter.close()


@pytest.mark.parametrize("role", [ROUTER, WORKER, EXPORTER])
def test_no_role_reaches_beyond_its_own(server: RedisProcess, role: str) -> None:
    admin = connect(settings(server), socket_timeout=5)
    client = client_of(settings(server), role)
    try:
        admin.set("elsewhere:x", "kept")
        allowed = [c for c in (*FORBIDDEN_TO_ALL, *FORBIDDEN[role]) if not refused(client, c)]
        assert allowed == []
        assert admin.get("elsewhere:x") == b"kept" and admin.ping()
    finally:
        client.close()
        admin.close()


@pytest.mark.parametrize(
    "change",
    [
        lambda c: dataclasses.replace(c, redis_password=role_password(PASSWORD, "admin")),
        lambda c: dataclasses.replace(c, redis_username="worker", redis_password=PASSWORD),
        lambda c: dataclasses.replace(
            as_role(c, ROUTER), redis_password=role_password(PASSWORD, WORKER)
        ),
    ],
    ids=["made-up role", "admin password as worker", "worker password as router"],
)
def test_a_role_password_opens_only_its_own_user(
    server: RedisProcess, change: Callable[[ClusterConfig], ClusterConfig]
) -> None:
    client = connect(change(settings(server)), socket_timeout=5)
    try:
        with pytest.raises(redis.AuthenticationError):
            client.ping()
    finally:
        client.close()


def test_every_role_has_its_own_password() -> None:
    made = {role_password(PASSWORD, role) for role in (ROUTER, WORKER, EXPORTER)}
    assert len(made) == 3 and PASSWORD not in made
    assert role_password(PASSWORD, WORKER) != role_password(PASSWORD + "x", WORKER)


def test_the_admin_keeps_every_command(tmp_path: Path) -> None:
    (port,) = free_local_ports(1)
    cfg = RedisConfig(port=port, password=PASSWORD, cluster=CLUSTER)
    with RedisProcess(cfg, tmp_path / "redis.log") as running:
        admin = connect(running.cluster_config, socket_timeout=5)
        try:
            admin.set("any", "1")
            assert admin.flushall() and admin.dbsize() == 0
            assert admin.config_get("maxmemory")
        finally:
            admin.close()


def test_the_compose_redis_conf_gives_each_service_its_user(tmp_path: Path) -> None:
    """deploy/init_secrets.py's redis.conf, loaded by a real redis-server as compose's
    ``redis`` service loads it: the worker and router logins it writes for those services
    and the exporter's password file open their role's user, and nothing more."""
    init_secrets().write(tmp_path, {"KVSERVE_REDIS_PASSWORD": PASSWORD})
    (port,) = free_local_ports(1)
    argv = [redis_binary(), str(tmp_path / "redis/redis.conf"), "--port", str(port)]
    argv += ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    admin = RedisConfig(port=port, password=(tmp_path / "redis/password").read_text())
    ready = Readiness(lambda: answers_ping(admin), "did not answer PING")
    server = ManagedProcess("redis", argv, tmp_path / "redis.log", ready=ready)
    server.start(20.0)
    try:
        cluster = dataclasses.replace(admin.cluster_config, cluster_secret=new_secret())
        for role in (ROUTER, WORKER):
            user, secret = ((tmp_path / role / f"redis_{k}").read_text() for k in KINDS)
            login = dataclasses.replace(cluster, redis_username=user, redis_password=secret)
            client = connect(login, socket_timeout=5)
            try:
                assert client.ping() and refused(client, ("FLUSHALL",))
                assert refused(client, (FORBIDDEN[role][0]))
            finally:
                client.close()
        (exporter_password,) = json.loads(
            (tmp_path / "exporter/passwords.json").read_text()
        ).values()
        exporter = dataclasses.replace(cluster, redis_username=EXPORTER)
        exporter = dataclasses.replace(exporter, redis_password=exporter_password)
        client = connect(exporter, socket_timeout=5)
        try:
            assert "redis_version" in client.info() and refused(client, ("SCAN", "0"))
        finally:
            client.close()
    finally:
        server.stop()
