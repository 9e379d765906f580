"""A worker's /metrics over real HTTP: every numeric load-report field as a gauge."""

from __future__ import annotations

import urllib.request
from collections.abc import Callable

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvpool.net import free_local_ports
from proto import worker_pb2 as pb
from workers.metrics_http import numeric_fields, serve_metrics


def scrape(report: Callable[[], pb.LoadReport]) -> dict[str, float]:
    (port,) = free_local_ports(1)
    server = serve_metrics("127.0.0.1", port, report)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
            text = reply.read().decode()
    finally:
        server.shutdown()
        server.server_close()
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}


def test_every_numeric_field_is_a_gauge() -> None:
    report = pb.LoadReport(running=3, free_pages=17, pool_connected=True, kv_read_seconds=0.5)
    got = scrape(lambda: report)
    assert got["kvserve_worker_up"] == 1.0
    assert got["kvserve_worker_running"] == 3.0
    assert got["kvserve_worker_free_pages"] == 17.0
    assert got["kvserve_worker_pool_connected"] == 1.0
    assert got["kvserve_worker_kv_read_seconds"] == 0.5
    assert set(got) == {"kvserve_worker_up"} | {
        f"kvserve_worker_{n}" for n in numeric_fields(report)
    }
    assert "kvserve_worker_role" not in got  # a string field is no gauge


def test_an_engine_that_does_not_answer_reads_as_down() -> None:
    def stuck() -> pb.LoadReport:
        raise TimeoutError("engine busy")

    assert scrape(stuck) == {"kvserve_worker_up": 0.0}


def test_a_busy_port_is_an_error() -> None:
    (port,) = free_local_ports(1)
    server = serve_metrics("127.0.0.1", port, pb.LoadReport)
    try:
        with pytest.raises(OSError):
            serve_metrics("127.0.0.1", port, pb.LoadReport)
    finally:
        server.shutdown()
        server.server_close()
