"""A worker's /metrics over real HTTP: vLLM's names where vLLM has the figure, ours
otherwise, counters as counters, and the worker's id, role and model on every series."""

from __future__ import annotations

import urllib.request
from collections.abc import Callable

import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from kvpool.net import free_local_ports
from proto import worker_pb2 as pb
from workers.core.histogram import Buckets
from workers.core.outputs import EngineStats
from workers.core.sequence import SamplingParams, Sequence
from workers.serve.metrics_http import (
    COUNTERS,
    GAUGES,
    WorkerCollector,
    WorkerSample,
    serve_metrics,
)

Sampler = Callable[[], WorkerSample]


PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0;q=0.5,application/openmetrics-text;"
    "version=0.0.1;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2"
)
"""What Prometheus 2 asks a target for: OpenMetrics first."""


def scrape(sample: Sampler, role: str = "decode") -> tuple[dict[str, str], list[Sample]]:
    """``(type by family name, samples)`` of one scrape of a worker serving ``sample``,
    asked for as Prometheus asks."""
    (port,) = free_local_ports(1)
    server = serve_metrics("127.0.0.1", port, WorkerCollector("d-0", "tiny", sample, lambda: role))
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/metrics", headers={"Accept": PROMETHEUS_ACCEPT}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            assert reply.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            text = reply.read().decode()
    finally:
        server.shutdown()
        server.server_close()
    assert "vllm_" not in text and "kvserve_" not in text  # no name rewritten to legacy form
    families = list(text_string_to_metric_families(text))
    return {f.name: f.type for f in families}, [s for f in families for s in f.samples]


def test_names_types_and_labels() -> None:
    report = pb.LoadReport(
        role="prefill",
        running=3,
        waiting=2,
        free_pages=25,
        total_pages=100,
        pool_outages=4,
        pool_reads_given_up=5,
        pool_objects_skipped=6,
    )
    queue = Buckets((0.1, 1.0))
    for seconds in (0.05, 0.5, 2.0):
        queue.observe(seconds)
    types, samples = scrape(lambda: WorkerSample(report, preemptions=7, queue_time=queue))
    labels = {"model_name": "tiny", "worker": "d-0", "role": "prefill"}  # the report's role
    assert all(s.labels.items() >= labels.items() for s in samples)
    value = {s.name: s.value for s in samples if "le" not in s.labels}
    assert value["kvserve:worker_up"] == 1.0
    assert value["vllm:num_requests_running"] == 3.0
    assert value["vllm:num_requests_waiting"] == 2.0
    assert value["vllm:kv_cache_usage_perc"] == pytest.approx(0.75)
    assert value["vllm:num_preemptions_total"] == 7.0
    assert value["kvserve:pool_outages_total"] == 4.0
    assert value["kvserve:pool_reads_given_up_total"] == 5.0
    assert value["kvserve:pool_objects_skipped_total"] == 6.0
    assert value["vllm:request_queue_time_seconds_count"] == 3.0
    assert value["vllm:request_queue_time_seconds_sum"] == pytest.approx(2.55)
    buckets = {s.labels["le"]: s.value for s in samples if "le" in s.labels}
    assert buckets == {"0.1": 1.0, "1.0": 2.0, "+Inf": 3.0}
    assert {n for n, t in types.items() if t == "counter"} == {
        *COUNTERS,
        "vllm:num_preemptions",
    }
    assert {n for n, t in types.items() if t == "gauge"} == {*GAUGES, "kvserve:worker_up"}


def test_an_engine_that_does_not_answer_reads_as_down() -> None:
    def stuck() -> WorkerSample:
        raise TimeoutError("engine busy")

    _, samples = scrape(stuck, role="mixed")
    assert [(s.name, s.labels["role"], s.value) for s in samples] == [
        ("kvserve:worker_up", "mixed", 0.0)
    ]


def test_a_busy_port_is_an_error() -> None:
    (port,) = free_local_ports(1)
    collector = WorkerCollector(
        "d-0", "tiny", lambda: WorkerSample(pb.LoadReport(), 0, Buckets()), str
    )
    server = serve_metrics("127.0.0.1", port, collector)
    try:
        with pytest.raises(OSError):
            serve_metrics("127.0.0.1", port, collector)
    finally:
        server.shutdown()
        server.server_close()


def test_queue_time_is_observed_once_per_request() -> None:
    stats = EngineStats()
    first = Sequence("a", [1, 2], SamplingParams(), queued_at=10.0)
    stats.record_scheduled([first], now=10.5)
    stats.record_scheduled([first], now=12.0)  # preempted and scheduled again: not counted
    resumed = Sequence("b", [1, 2], SamplingParams())  # never queued (a reservation's)
    stats.record_scheduled([resumed], now=13.0)
    assert (stats.queue_time.count, stats.queue_time.total) == (1, 0.5)
    assert first.queued_at is None


def test_buckets_in_prometheus_form() -> None:
    buckets = Buckets((1.0, 2.0))
    for value in (0.5, 1.0, 1.5, 9.0):
        buckets.observe(value)
    assert buckets.cumulative() == [("1.0", 2.0), ("2.0", 3.0), ("+Inf", 4.0)]
    with pytest.raises(ValueError):
        Buckets((2.0, 1.0))
