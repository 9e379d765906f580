"""``kvserve probe``: what it dials comes from the service's own variables, and it tells a
healthy service from an unhealthy one over real sockets (gRPC health, HTTP, TCP)."""

from __future__ import annotations

import http.server
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from kvpool.net import free_local_ports
from kvserve.cluster.probe import check, targets


def test_targets_follow_the_services_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    assert targets("worker") == ("127.0.0.1:50061",)  # the defaults
    monkeypatch.setenv("KVSERVE_WORKER_HOST", "0.0.0.0")  # wildcard: dialled on loopback
    monkeypatch.setenv("KVSERVE_WORKER_PORT", "7001")
    monkeypatch.setenv("KVSERVE_ROUTER_HOST", "10.1.2.3")
    monkeypatch.setenv("KVSERVE_ROUTER_PORT", "8100")
    monkeypatch.setenv("KVSERVE_MASTER_HOST", "::")
    monkeypatch.setenv("KVSERVE_MASTER_PORT", "7002")
    assert targets("worker") == ("127.0.0.1:7001",)
    assert targets("router") == ("http://10.1.2.3:8100/health",)
    assert targets("pool") == ("127.0.0.1:7002", "127.0.0.1:8080")


@pytest.fixture
def health_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[health.HealthServicer]:
    (port,) = free_local_ports(1)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    monkeypatch.setenv("KVSERVE_WORKER_PORT", str(port))
    yield servicer
    server.stop(0)


def test_worker_probe_asks_the_grpc_health_service(health_server: health.HealthServicer) -> None:
    health_server.set("", health_pb2.HealthCheckResponse.SERVING)
    assert check("worker", 3.0) == ""
    health_server.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
    assert "is not SERVING" in check("worker", 3.0)


class Health(http.server.BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:
        self.send_response(self.status if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_router_probe_wants_200_from_health(monkeypatch: pytest.MonkeyPatch) -> None:
    server = http.server.HTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("KVSERVE_ROUTER_PORT", str(server.server_address[1]))
    try:
        assert check("router", 3.0) == ""
        Health.status = 503
        assert "did not answer 200" in check("router", 3.0)
    finally:
        Health.status = 200
        server.shutdown()
        server.server_close()


def test_pool_probe_needs_both_ports_and_exits_by_status(monkeypatch: pytest.MonkeyPatch) -> None:
    listeners = [socket.create_server(("127.0.0.1", 0)) for _ in range(2)]
    rpc, meta = (s.getsockname()[1] for s in listeners)
    env = {"KVSERVE_MASTER_PORT": str(rpc), "KVSERVE_MASTER_METADATA_PORT": str(meta)}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    probe = [sys.executable, "-m", "kvserve", "probe", "pool"]
    try:
        assert check("pool", 1.0) == ""
        assert subprocess.run(probe, capture_output=True, check=False).returncode == 0
        listeners.pop().close()
        assert check("pool", 1.0) == f"127.0.0.1:{meta} closed"
        failed = subprocess.run(probe, capture_output=True, text=True, check=False)
        assert failed.returncode == 1 and f"127.0.0.1:{meta} closed" in failed.stderr
    finally:
        for listener in listeners:
            listener.close()
