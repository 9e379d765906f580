"""``kvserve probe worker|router|pool``: the health check of a service that runs as
``kvserve <verb>``, for container health checks. It reads the same ``KVSERVE_*``
variables (and flags) as the service, so it dials exactly where the service listens
(a wildcard bind address, 0.0.0.0 or ::, is dialled on loopback):

- ``worker``: the standard gRPC health service says SERVING (with the cluster's TLS);
- ``router``: ``GET /health`` answers 200 (a decode-capable worker is registered, the
  tokenizer loaded);
- ``pool``: mooncake_master's RPC port and the HTTP metadata server's port accept
  connections (in HA mode, ``--master-etcd-endpoints``: its metrics port, which a standby
  serves too).

Exit status 0 when healthy, 1 otherwise with the reason on stderr.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import ClassVar

from kvpool.master import MasterConfig
from kvpool.net import port_open
from kvserve.settings import add_config_args, config_from_args, setting
from proto.registry import ClusterConfig
from workers.config import WorkerConfig

SERVICES = ("worker", "router", "pool")


@dataclass(frozen=True)
class ProbeConfig:
    """What ``kvserve probe`` checks.

    - ``service``: the service to check, as its own verb is configured;
    - ``timeout_s``: seconds each check may take.
    """

    env_prefix: ClassVar[str] = "KVSERVE_PROBE_"
    service: str = setting(positional=True, choices=SERVICES)
    timeout_s: float = 3.0


SETTINGS = (ProbeConfig,)


def dial_host(host: str) -> str:
    """Where to reach a service bound to ``host`` from the same machine."""
    return "127.0.0.1" if host in ("", "0.0.0.0", "::") else host


def _settings(*classes: type) -> argparse.Namespace:
    """The services' settings as their own verbs read them (variables and defaults)."""
    parser = argparse.ArgumentParser(add_help=False)
    for cls in classes:
        add_config_args(parser, cls)
    ns, _ = parser.parse_known_args([])
    return ns


def targets(service: str) -> tuple[str, ...]:
    """What the probe of ``service`` dials: a worker's ``host:port``, the router's health
    URL, or the pool's ``host:port`` pair (master RPC, metadata server)."""
    from router.config import RouterConfig

    if service == "worker":
        worker = config_from_args(WorkerConfig, _settings(WorkerConfig))
        return (f"{dial_host(worker.worker_host)}:{worker.worker_port}",)
    if service == "router":
        router = config_from_args(RouterConfig, _settings(RouterConfig))
        return (f"http://{dial_host(router.router_host)}:{router.router_port}/health",)
    master = config_from_args(MasterConfig, _settings(MasterConfig))
    host = dial_host(master.master_host)
    if master.master_etcd_endpoints:  # HA mode: a standby serves its metrics, no RPC
        return (f"{host}:{master.master_metrics_port}",)
    return tuple(f"{host}:{p}" for p in (master.master_port, master.master_metadata_port))


def check(service: str, timeout: float) -> str:
    """'' when ``service`` is healthy, else why not."""
    from kvserve.cluster.health import grpc_serving, http_ok

    if service == "worker":
        (address,) = targets(service)
        cluster = config_from_args(ClusterConfig, _settings(ClusterConfig))
        return "" if grpc_serving(address, cluster, timeout) else f"{address} is not SERVING"
    if service == "router":
        (url,) = targets(service)
        return "" if http_ok(url, timeout) else f"{url} did not answer 200"
    closed = [a for a in targets(service) if not _open(a, timeout)]
    return f"{', '.join(closed)} closed" if closed else ""


def _open(address: str, timeout: float) -> bool:
    host, port = address.rsplit(":", 1)
    return port_open(host, int(port), timeout)


def run(args: argparse.Namespace) -> int:
    """Check ``args.service``: 0 when healthy, else 1 with the reason on stderr."""
    reason = check(args.service, args.timeout_s)
    if reason:
        print(f"kvserve probe {args.service}: {reason}", file=sys.stderr)
        return 1
    return 0
