"""A worker's own Prometheus endpoint: ``GET /metrics`` on ``worker_host:
worker_metrics_port`` (off when the port is 0), for a scraper that reaches every component.

It is the one source of the worker's state (the router exports none of it; names:
:mod:`proto.metric_names`). Every series carries ``model_name``, ``worker`` (its id) and
``role`` (the role it reports now, so a series follows a worker the P:D controller moved,
whatever the scrape job is called; a counter then continues under its new role's series):

- vLLM's: ``vllm:num_requests_running`` / ``vllm:num_requests_waiting``,
  ``vllm:kv_cache_usage_perc`` (used share of the KV pages, 0..1; cached pages no request
  holds count as free, as in vLLM), ``vllm:num_preemptions_total`` and the
  ``vllm:request_queue_time_seconds`` histogram (queued until first scheduled);
- ours: ``kvserve:worker_up`` (1 while the engine answers a scrape; alone, at 0, when it
  does not), ``kvserve:worker_draining``, ``kvserve:reserved_requests`` (pages held for
  remote prefills), ``kvserve:queued_prefill_tokens``, ``kvserve:kv_pages_free`` /
  ``kvserve:kv_pages_total``, the measured ``kvserve:prefill_tokens_per_second`` and
  ``kvserve:decode_tokens_per_second``, and the pool's health: ``kvserve:pool_connected``,
  ``kvserve:pool_outages_total``, ``kvserve:pool_forged_blocks_total`` (blocks refused for
  a missing or wrong MAC), ``kvserve:pool_checksum_failures_total``,
  ``kvserve:pool_healed_blocks_total`` (removed for failing verification), and chain-aware
  eviction's (:mod:`kvpool.evictor`): ``kvserve:pool_evicted_blocks_total``,
  ``kvserve:pool_refused_blocks_total``, ``kvserve:pool_orphans_removed_total``,
  ``kvserve:pool_index_errors_total``; reads that spared a member that did not answer
  lately (:mod:`kvpool.peers`): ``kvserve:pool_reads_given_up_total``,
  ``kvserve:pool_objects_skipped_total``; and with the pool's SSD tier
  (``--pool-ssd-dir``) where loads were served from:
  ``kvserve:pool_{dram,ssd}_objects_read_total`` and ``kvserve:pool_{dram,ssd}_read_seconds_total``.

Lifecycle: :func:`serve_metrics` starts the HTTP server on a daemon thread and returns it;
each scrape calls ``sample()`` (bounded by its own timeout); ``server.shutdown()`` stops it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server
from wsgiref.types import StartResponse, WSGIEnvironment

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, ThreadingWSGIServer
from prometheus_client.registry import Collector

from proto import worker_pb2 as pb
from proto.metric_names import MODEL_LABEL, OURS, ROLE_LABEL, VLLM, WORKER_LABEL
from workers.core.histogram import Buckets

log = logging.getLogger(__name__)
LABELS = (MODEL_LABEL, WORKER_LABEL, ROLE_LABEL)

GAUGES: dict[str, tuple[str, Callable[[pb.LoadReport], float]]] = {
    f"{VLLM}num_requests_running": ("Requests running", lambda r: r.running),
    f"{VLLM}num_requests_waiting": ("Requests waiting", lambda r: r.waiting),
    f"{VLLM}kv_cache_usage_perc": (
        "KV cache usage (used share of the pages, 0..1)",
        lambda r: 1.0 - r.free_pages / r.total_pages if r.total_pages else 0.0,
    ),
    f"{OURS}worker_draining": ("1 while draining for a role change", lambda r: r.draining),
    f"{OURS}reserved_requests": ("Pages held for remote prefills", lambda r: r.reserved),
    f"{OURS}queued_prefill_tokens": ("Prompt tokens still to compute",
                                     lambda r: r.queued_prefill_tokens),
    f"{OURS}kv_pages_free": ("Free KV pages", lambda r: r.free_pages),
    f"{OURS}kv_pages_total": ("KV pages", lambda r: r.total_pages),
    f"{OURS}prefill_tokens_per_second": ("Measured prefill speed",
                                         lambda r: r.prefill_tokens_per_s),
    f"{OURS}decode_tokens_per_second": ("Measured decode speed",
                                        lambda r: r.decode_tokens_per_s),
    f"{OURS}pool_connected": ("1 while the KV pool is reachable", lambda r: r.pool_connected),
}  # fmt: skip
"""Gauge name -> (help, value of a load report)."""
COUNTERS: dict[str, tuple[str, Callable[[pb.LoadReport], float]]] = {
    f"{OURS}pool_outages": ("Times the KV pool became unreachable", lambda r: r.pool_outages),
    f"{OURS}pool_forged_blocks": ("Pool blocks refused: MAC missing or wrong",
                                  lambda r: r.pool_forged_blocks),
    f"{OURS}pool_checksum_failures": ("Pool blocks refused: a layer failed its digest",
                                      lambda r: r.pool_checksum_failures),
    f"{OURS}pool_evicted_blocks": ("Pool blocks evicted for the budget (chain tails, LRU)",
                                   lambda r: r.pool_evicted_blocks),
    f"{OURS}pool_refused_blocks": ("Pool blocks not written: they or a prefix were evicted",
                                   lambda r: r.pool_refused_blocks),
    f"{OURS}pool_orphans_removed": ("Pool blocks written while evicted elsewhere, removed",
                                    lambda r: r.pool_orphans_removed),
    f"{OURS}pool_healed_blocks": ("Pool blocks removed for failing verification",
                                  lambda r: r.pool_healed_blocks),
    f"{OURS}pool_index_errors": ("Pool chain-index calls that failed",
                                 lambda r: r.pool_index_errors),
    f"{OURS}pool_dram_objects_read": ("Pool objects loaded from DRAM (SSD tier on)",
                                      lambda r: r.pool_dram_objects),
    f"{OURS}pool_ssd_objects_read": ("Pool objects loaded from the SSD tier",
                                     lambda r: r.pool_ssd_objects),
    f"{OURS}pool_dram_read_seconds": ("Seconds loading pool objects from DRAM (SSD tier on)",
                                      lambda r: r.pool_dram_read_seconds),
    f"{OURS}pool_ssd_read_seconds": ("Seconds loading pool objects from the SSD tier",
                                     lambda r: r.pool_ssd_read_seconds),
    f"{OURS}pool_reads_given_up": ("Pool value reads given up (read as misses): a member "
                                   "did not answer within twice the transfer timeout",
                                   lambda r: r.pool_reads_given_up),
    f"{OURS}pool_objects_skipped": ("Pool objects not read: only a member that did not "
                                    "answer lately held them (recomputed)",
                                    lambda r: r.pool_objects_skipped),
}  # fmt: skip
"""Counter name (without ``_total``) -> (help, value of a load report)."""
PREEMPTIONS = f"{VLLM}num_preemptions"
QUEUE_TIME = f"{VLLM}request_queue_time_seconds"
UP = f"{OURS}worker_up"


@dataclass(frozen=True)
class WorkerSample:
    """What one scrape shows: the load report (its role included) and the engine's own
    cumulative figures that are no part of the report."""

    report: pb.LoadReport
    preemptions: int
    queue_time: Buckets


class WorkerCollector(Collector):
    """Turns ``sample()`` into the worker's series at each scrape; ``role()`` (cheap, no
    engine call) labels ``kvserve:worker_up`` when the engine does not answer."""

    def __init__(
        self, worker: str, model: str, sample: Callable[[], WorkerSample], role: Callable[[], str]
    ) -> None:
        self._worker, self._model = worker, model
        self._sample, self._role = sample, role

    def collect(self) -> Iterator[Metric]:
        try:
            got: WorkerSample | None = self._sample()
        except Exception as exc:  # the engine is stopping or stuck: say so, do not fail
            log.warning("no load report for /metrics: %s", exc)
            got = None
        role = got.report.role if got is not None else self._role()
        labels = [self._model, self._worker, role]
        up = GaugeMetricFamily(UP, "1 while the engine answers", labels=LABELS)
        up.add_metric(labels, 1.0 if got is not None else 0.0)
        yield up
        if got is None:
            return
        report = got.report
        for name, (doc, value) in GAUGES.items():
            gauge = GaugeMetricFamily(name, doc, labels=LABELS)
            gauge.add_metric(labels, float(value(report)))
            yield gauge
        counted = {n: (doc, value(report)) for n, (doc, value) in COUNTERS.items()}
        counted[PREEMPTIONS] = ("Requests preempted (recomputed later)", got.preemptions)
        for name, (doc, total) in counted.items():
            counter = CounterMetricFamily(name, doc, labels=LABELS)
            counter.add_metric(labels, float(total))
            yield counter
        queue = HistogramMetricFamily(
            QUEUE_TIME, "Time a request waited in the queue before first scheduled", labels=LABELS
        )
        queue.add_metric(labels, got.queue_time.cumulative(), got.queue_time.total)
        yield queue


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        """One scrape a second would flood the worker's log."""


def serve_metrics(host: str, port: int, collector: WorkerCollector) -> WSGIServer:
    """Start ``/metrics`` on ``host:port`` (see the module docstring) on a daemon thread.

    Always the classic text format, whatever the scraper's ``Accept`` asks, as the router
    serves: prometheus_client's OpenMetrics encoder, which Prometheus prefers, rewrites a
    name's ``:`` to ``_`` for a scraper that did not ask for UTF-8 names (``vllm:`` would
    reach Prometheus as ``vllm_``)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    app = make_wsgi_app(registry)

    def text_only(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        body: Iterable[bytes] = app(
            {**environ, "HTTP_ACCEPT": CONTENT_TYPE_PLAIN_0_0_4}, start_response
        )
        return body

    server = make_server(host, port, text_only, ThreadingWSGIServer, handler_class=_QuietHandler)
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    log.info("metrics on http://%s:%d/metrics", host, port)
    return server
