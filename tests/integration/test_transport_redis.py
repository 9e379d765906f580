"""The registry against a real ``redis-server`` that asks for credentials: a password
(``requirepass``) and ACL users, started the way ``kvserve up`` starts it.

Right credentials: the registry works. Wrong or missing ones: a clear error that names the
setting, from the registry client, from a worker's start (it exits before loading a model)
and from the router's view (which logs and keeps its last view)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvpool.net import free_local_ports
from kvserve.cluster.redis import RedisConfig, RedisProcess
from proto.registry import (
    ClusterConfig,
    RegistryAccessError,
    WorkerRecord,
    check,
    connect,
    list_workers,
    publish,
    withdraw,
)
from router.placement.worker_view import WorkerView
from workers.serve.registration import Heartbeat

ROOT = Path(__file__).resolve().parents[2]
PASSWORD = 'pw with "quotes", spaces and \\ ' + uuid.uuid4().hex


def record(worker_id: str) -> WorkerRecord:
    """A record that beat just now (the router refuses one past the liveness window)."""
    now = time.time()
    return WorkerRecord(worker_id, "127.0.0.1:1", "decode", "m", "/m", "c", 16, 2, 64, now, now)


@pytest.fixture(scope="module")
def password_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisProcess]:
    (port,) = free_local_ports(1)
    log = tmp_path_factory.mktemp("redis-pw") / "redis.log"
    with RedisProcess(RedisConfig(port=port, password=PASSWORD), log) as server:
        yield server


def unique(cluster: ClusterConfig, **changes: object) -> ClusterConfig:
    name = f"t{uuid.uuid4().hex[:8]}"
    return dataclasses.replace(cluster, cluster=name, **changes)  # type: ignore[arg-type]


def access_error(cluster: ClusterConfig) -> str:
    client = connect(cluster, socket_timeout=2, socket_connect_timeout=2)
    try:
        with pytest.raises(RegistryAccessError) as refused:
            check(client, cluster)
    finally:
        client.close()
    return str(refused.value)


def test_password_registry_round_trip_and_refusals(password_redis: RedisProcess) -> None:
    cluster = unique(password_redis.cluster_config)
    client = connect(cluster, socket_timeout=2)
    try:
        check(client, cluster)
        publish(client, cluster.keys, record("w1"), 5.0)
        assert [r.worker_id for r in list_workers(client, cluster.keys)] == ["w1"]
        withdraw(client, cluster.keys, "w1")
    finally:
        client.close()
    pid = password_redis.process.pid
    assert PASSWORD.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()
    log_path = password_redis.process.log_path
    assert log_path is not None and not list(log_path.parent.glob("*.auth.conf"))
    for wrong in ("", "wrong"):
        text = access_error(dataclasses.replace(cluster, redis_password=wrong))
        assert "KVSERVE_REDIS_PASSWORD" in text and PASSWORD not in text


def test_worker_start_fails_with_the_setting_named(password_redis: RedisProcess) -> None:
    (port,) = free_local_ports(1)
    argv = [sys.executable, "-m", "kvserve", "worker", "--no-use-pool", "--model", "/nowhere",
            "--worker-port", str(port), "--redis-url", password_redis.url]  # fmt: skip
    env = {**os.environ, "KVSERVE_REDIS_PASSWORD": "wrong"}
    done = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert "KVSERVE_REDIS_PASSWORD" in done.stderr and "refused" in done.stderr


def test_router_view_logs_and_keeps_its_last_view(
    password_redis: RedisProcess, caplog: pytest.LogCaptureFixture
) -> None:
    cluster = unique(password_redis.cluster_config)
    admin = connect(cluster, socket_timeout=2)
    publish(admin, cluster.keys, record("w1"), 30.0)

    async def scenario() -> tuple[list[str], list[str], list[str]]:
        wrong = WorkerView(dataclasses.replace(cluster, redis_password="wrong"))
        await wrong.poll_once()
        refused = [w.worker_id for w in wrong.live()]
        await wrong.stop()
        view = WorkerView(cluster, clock=lambda: 0.0)
        try:
            await view.poll_once()
            before = [w.worker_id for w in view.live()]
            admin.config_set("requirepass", "changed")  # then drop every other connection,
            admin.client_kill_filter(_type="normal", skipme=True)  # so the view must re-auth
            await view.poll_once()
            return refused, before, [w.worker_id for w in view.live()]
        finally:
            admin.config_set("requirepass", PASSWORD)
            await view.stop()

    try:
        with caplog.at_level(logging.WARNING, logger="router.placement.worker_view"):
            refused, before, after = asyncio.run(scenario())
        assert refused == [] and before == after == ["w1"]
        warnings = [
            r.getMessage() for r in caplog.records if r.name == "router.placement.worker_view"
        ]
        assert len(warnings) == 2 and all("KVSERVE_REDIS_PASSWORD" in w for w in warnings)
    finally:
        withdraw(admin, cluster.keys, "w1")
        admin.close()


def test_acl_users(tmp_path: Path) -> None:
    (port,) = free_local_ports(1)
    cfg = RedisConfig(port=port, username="kv", password="kv-secret")
    with RedisProcess(cfg, tmp_path / "redis.log") as server:
        owner = unique(server.cluster_config)
        assert "KVSERVE_REDIS_USERNAME" in access_error(
            dataclasses.replace(owner, redis_username="", redis_password="")
        )
        admin = connect(owner, socket_timeout=2)
        try:  # a user confined to one cluster's keys, with the registry's commands only
            admin.acl_setuser(
                "narrow", enabled=True, passwords=["+narrow-pw"], keys=[f"{owner.cluster}:*"],
                categories=["+@read", "+@write", "+@keyspace", "+@connection", "+@scripting"],
            )  # fmt: skip
            narrow = dataclasses.replace(owner, redis_username="narrow", redis_password="narrow-pw")
            beat = Heartbeat(narrow, record("w2"), dict)
            beat.beat()
            assert [r.worker_id for r in list_workers(admin, owner.keys)] == ["w2"]
            beat.stop()
            assert list_workers(admin, owner.keys) == []
            elsewhere = Heartbeat(unique(narrow), record("w3"), dict)
            with pytest.raises(RegistryAccessError, match=r"'narrow' lacks .*\+@keyspace"):
                elsewhere.beat()
            elsewhere.client.close()
        finally:
            admin.close()


def test_a_busy_engine_keeps_its_worker_registered(password_redis: RedisProcess) -> None:
    """A load report that does not come in time (the engine thread is busy) still gives a
    heartbeat: the record is published again with the last report, not left to expire."""
    cluster = unique(password_redis.cluster_config)
    reports: list[dict[str, object] | Exception] = [{"running": 3}, TimeoutError()]

    def load() -> dict[str, object]:
        answer = reports.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    beat = Heartbeat(cluster, record("busy"), load)
    admin = connect(cluster, socket_timeout=2)
    try:
        beat.beat()
        first = list_workers(admin, cluster.keys)[0]
        beat.beat()  # the engine did not answer
        (again,) = list_workers(admin, cluster.keys)
        assert again.load == {"running": 3} == first.load
        assert again.heartbeat_at > first.heartbeat_at
    finally:
        beat.stop()
        admin.close()
