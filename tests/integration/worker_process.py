"""One real ``kvserve worker`` process on the tiny model, for tests that need the real
wiring (CLI, server, registry): the services it joins (Redis and mooncake_master on free
loopback ports), the worker itself (127.0.0.1, a free port, a 16 MiB KV cache), and the wait
until its health service says SERVING."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from kvpool.master import MasterConfig
from kvpool.net import free_local_ports
from kvserve.cluster.health import grpc_serving
from kvserve.cluster.processes import ManagedProcess
from kvserve.cluster.redis import RedisConfig, RedisProcess
from proto.registry import ClusterConfig
from tests.integration.pool_fixtures import running_master

Services = tuple[str, MasterConfig]
"""The Redis URL and the pool's master a worker joins."""


@contextmanager
def worker_services(log_dir: Path) -> Iterator[Services]:
    """Redis and mooncake_master on free loopback ports, both stopped when the block ends."""
    (port,) = free_local_ports(1)
    with (
        RedisProcess(RedisConfig(port=port), log_dir / "redis.log") as redis_proc,
        running_master(log_dir) as master,
    ):
        yield redis_proc.url, master


def start_worker(
    name: str,
    model: Path,
    services: Services,
    log_dir: Path,
    *extra: str,
    env: Mapping[str, str] | None = None,
) -> tuple[ManagedProcess, str]:
    """Start worker ``name`` (``extra``: more flags; ``env``: more environment, such as
    ``KVSERVE_CLUSTER_SECRET``); returns its process (the caller stops it) and address."""
    redis_url, master = services
    (port,) = free_local_ports(1)
    argv = [sys.executable, "-m", "kvserve", "worker", "--worker-port", str(port),
            "--worker-host", "127.0.0.1", "--worker-id", name, "--model", str(model),
            "--redis-url", redis_url, "--pool-master", master.rpc_address,
            "--pool-metadata-server", master.metadata_url, "--pool-segment-mib", "32",
            "--pool-local-buffer-mib", "16", "--kv-cache-mib", "16", "--block-tokens", "16",
            "--threads", "1", *extra]  # fmt: skip
    proc = ManagedProcess(name, argv, log_dir / f"{name}.log", env)
    return proc.start(), f"127.0.0.1:{port}"


def wait_serving(
    address: str, proc: ManagedProcess, cluster: ClusterConfig | None = None, timeout: float = 120
) -> None:
    """Wait until the worker says SERVING to a health check made with ``cluster``'s settings
    (its secret: a worker with one answers no check without a token); fail with the tail of
    its log if it exits or never does."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.running, proc.log_tail()
        if grpc_serving(address, cluster or ClusterConfig(), timeout=1):
            return
        time.sleep(0.2)
    raise AssertionError(f"worker not serving: {proc.log_tail()}")
