"""Health checks of a cluster's processes, as its launcher, ``kvserve probe``, the chaos
tool and the tests ask them: a worker's gRPC health service, the router's ``/health``
(how many workers it counts), any URL answering 200."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from proto.registry import ClusterConfig


def grpc_serving(address: str, cluster: ClusterConfig, timeout: float = 1.0) -> bool:
    """Whether the worker at ``address`` reports SERVING on the standard health service
    (dialled with the cluster's TLS and keepalive settings, as the ``monitor`` identity:
    a worker with a cluster secret refuses health checks without its token)."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from proto.channels import sync_channel
    from proto.grpc_auth import MONITOR

    with sync_channel(address, cluster, identity=MONITOR) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout)
        except grpc.RpcError:
            return False
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


def router_workers(router_url: str, timeout: float = 2.0) -> int:
    """How many workers the router's ``/health`` counts as live (0 when it is not healthy
    or does not answer)."""
    try:
        with urllib.request.urlopen(router_url + "/health", timeout=timeout) as reply:
            return int(json.load(reply).get("workers", 0))
    except (OSError, ValueError, urllib.error.URLError):
        return 0


def http_ok(url: str, timeout: float = 1.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return int(resp.status) == 200
    except (urllib.error.URLError, OSError):
        return False
