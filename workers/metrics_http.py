"""A worker's own Prometheus endpoint: ``GET /metrics`` on ``worker_host:
worker_metrics_port`` (off when the port is 0), for a scraper that reaches every component
(the compose file's Prometheus). It serves the worker's current load report, the message
the router also reads over gRPC and from the registry, as one gauge per numeric field,
``kvserve_worker_<field>`` (the scraper adds the instance label), plus ``kvserve_worker_up``.

Lifecycle: :func:`serve_metrics` starts the HTTP server on a daemon thread and returns it;
each scrape calls ``report()`` (bounded by its own timeout; a scrape during shutdown shows
only ``kvserve_worker_up 0``); ``server.shutdown()`` stops it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from wsgiref.simple_server import WSGIServer

from google.protobuf.descriptor import FieldDescriptor
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from proto import worker_pb2 as pb

log = logging.getLogger(__name__)
NUMERIC = {
    *(FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_BOOL),
    *(FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_INT64),
    *(FieldDescriptor.TYPE_UINT32, FieldDescriptor.TYPE_UINT64),
}


def numeric_fields(report: pb.LoadReport) -> dict[str, float]:
    """Every singular numeric (or bool) field of a load report, by name."""
    return {
        f.name: float(getattr(report, f.name))
        for f in report.DESCRIPTOR.fields
        if f.type in NUMERIC and not f.is_repeated
    }


class LoadCollector(Collector):
    """Turns ``report()`` into gauges at each scrape."""

    def __init__(self, report: Callable[[], pb.LoadReport]) -> None:
        self._report = report

    def collect(self) -> Iterator[GaugeMetricFamily]:
        try:
            values = numeric_fields(self._report())
        except Exception as exc:  # the engine is stopping or stuck: say so, do not fail
            log.warning("no load report for /metrics: %s", exc)
            values = None
        up = 1.0 if values is not None else 0.0
        yield GaugeMetricFamily("kvserve_worker_up", "1 while the engine answers", up)
        for name, value in (values or {}).items():
            yield GaugeMetricFamily(f"kvserve_worker_{name}", f"Load report: {name}", value)


def serve_metrics(host: str, port: int, report: Callable[[], pb.LoadReport]) -> WSGIServer:
    """Start ``/metrics`` on ``host:port`` (see the module docstring)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(LoadCollector(report))
    server, _ = start_http_server(port, addr=host, registry=registry)
    log.info("metrics on http://%s:%d/metrics", host, port)
    return server
