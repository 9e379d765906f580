""":func:`vllm_backend.preflight.may_start`, what ``kvserve worker --engine vllm`` checks
before it imports vLLM (real sockets on 127.0.0.1; the registry unreachable, which
:func:`workers.serve.serving.admitted` leaves to the heartbeat): the pool off is refused, a
prefill or decode worker whose pool master does not answer is refused with its role and the
address, a mixed one starts without the pool's master, and a listening master is enough."""

from __future__ import annotations

import dataclasses
import logging
import socket

import pytest

from kvpool.config import PoolConfig
from kvpool.net import free_local_ports
from proto.registry import ClusterConfig
from vllm_backend.preflight import may_start
from workers.config import WorkerConfig


@pytest.fixture
def cluster() -> ClusterConfig:
    (closed,) = free_local_ports(1)
    return ClusterConfig(redis_url=f"redis://127.0.0.1:{closed}/0")


def pool_at(port: int) -> PoolConfig:
    return dataclasses.replace(PoolConfig(), pool_master=f"127.0.0.1:{port}")


def test_the_pool_off_is_refused(cluster: ClusterConfig, caplog: pytest.LogCaptureFixture) -> None:
    (closed,) = free_local_ports(1)
    worker = WorkerConfig(role="mixed", use_pool=False)
    with caplog.at_level(logging.ERROR):
        assert not may_start(worker, pool_at(closed), cluster)
    assert "keep --use-pool" in caplog.text


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_a_role_that_needs_the_pool_is_refused_without_its_master(
    role: str, cluster: ClusterConfig, caplog: pytest.LogCaptureFixture
) -> None:
    (closed,) = free_local_ports(1)
    with caplog.at_level(logging.ERROR):
        assert not may_start(WorkerConfig(role=role), pool_at(closed), cluster)
    said = f"the {role} role needs the KV pool, which vLLM could not join"
    assert f"{said}: nothing answers at 127.0.0.1:{closed}" in caplog.text


def test_a_mixed_worker_starts_without_the_master(cluster: ClusterConfig) -> None:
    (closed,) = free_local_ports(1)
    assert may_start(WorkerConfig(role="mixed"), pool_at(closed), cluster)


def test_a_listening_master_is_enough(cluster: ClusterConfig) -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        pool = pool_at(server.getsockname()[1])
        assert may_start(WorkerConfig(role="prefill"), pool, cluster)
