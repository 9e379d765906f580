"""Prometheus metrics of one router (one registry per app, never the global one).

Naming (:mod:`proto.metric_names`; the README's "Metrics" table): the request figures
vLLM also has keep vLLM's names (:class:`router.observability.request_metrics.RequestMetrics`); the
router's own are ``kvserve:*``. The router exports no worker's state: each worker serves
its own queues, pages and pool health on its ``/metrics`` (:mod:`workers.serve.metrics_http`),
so every series has one source.

Ours: ``kvserve:requests_total{status}`` counts every API request by how it ended (``ok``,
``error``, ``timeout``, ``cancelled``; ``rejected``: refused before it ran, 400, 404, 413, 415,
429, 503); ``kvserve:admission_rejections_total`` the 429s of admission control, by worker;
``kvserve:auth_failures_total`` the 401s of any route (no API key, or a wrong one);
``kvserve:host_refusals_total`` the 400s for a ``Host`` the router does not serve. KV
moved through the pool: ``kvserve:kv_transfer_bytes_total`` / ``_seconds_total`` by
``direction`` (``write``: a prefill's KV into the pool; ``read``: a decode worker's from
it). Decode memory: ``kvserve:requests_waiting_for_kv`` the requests waiting now in the
router's queue for KV pages on the decode workers (:mod:`router.placement.kv_wait`),
``kvserve:kv_wait_seconds`` how long each one that had to wait spent there, however its
wait ended. Registry: ``kvserve:registry_rejected_records_total`` counts the values under
the workers' keys in Redis that the router refused at a poll (each poll that reads one
counts it again): ``reason="mac"`` for no MAC or a wrong one (not written with the
cluster secret), ``reason="invalid"`` for a record out of the schema. The P:D
controller's figures: ``kvserve:role_changes_total`` by outcome, ``kvserve:workers`` live
by role, ``kvserve:slo_attainment`` of its window (NaN: too few samples);
``kvserve:controller_leader`` is 1 on the router whose controller holds the lease and
decides (:mod:`router.control.lease`), 0 on every other. ``kvserve:router_info`` is 1,
labelled with the router's id (``router``): which router of several answered a scrape.
``kvserve:migrations_total``: requests moved to another decode worker after output began.
``kvserve:kv_handoffs_total{path}``: disaggregated prompts by how their KV reached the decode
worker: ``push`` (a direct push that succeeded), ``push_failed`` (a push was made and
failed: the pool carried it), ``pool`` (no push: ``--kv-handoff pool``, or the decode worker
offered no target).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from proto.metric_names import OURS
from proto.records import ROLES
from router.observability.index_metrics import IndexMetrics
from router.observability.request_metrics import LATENCY_BUCKETS, RequestMetrics


class RouterMetrics:
    """Lifecycle: one per app, with the router's id (``""``: no ``kvserve:router_info``
    sample) -> :meth:`set_model` and :meth:`update_roles` from each registry poll,
    ``requests.observe_*`` / ``count_*`` from request flows -> :meth:`render` for
    ``/metrics``."""

    def __init__(self, router_id: str = "") -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.router_info = Gauge(
            f"{OURS}router_info", "Always 1, labelled with this router's id (--router-id)",
            ("router",), registry=r,
        )  # fmt: skip
        if router_id:
            self.router_info.labels(router_id).set(1)
        self.requests = RequestMetrics(r)
        """The request figures under vLLM's names."""
        self.statuses = Counter(
            f"{OURS}requests", "API requests by how they ended", ("status",), registry=r
        )
        self.admission_rejections = Counter(
            f"{OURS}admission_rejections", "Requests refused (429) for a predicted TTFT over "
            "--admission-ttft-s, by the worker that would have prefilled", ("worker",), registry=r,
        )  # fmt: skip
        self.auth_failures = Counter(
            f"{OURS}auth_failures", "HTTP requests refused (401) for a missing or wrong API key",
            registry=r,
        )  # fmt: skip
        self.host_refusals = Counter(
            f"{OURS}host_refusals", "HTTP requests refused (400) for a Host header naming no "
            "address this router serves (--allowed-hosts)", registry=r,
        )  # fmt: skip
        self.registry_rejections = Counter(
            f"{OURS}registry_rejected_records", "Worker records read from Redis and refused, "
            "by reason (mac: not written with the cluster secret; invalid: out of the schema; "
            "stale: a heartbeat older than the liveness window)",
            ("reason",), registry=r,
        )  # fmt: skip
        self.kv_waiting = Gauge(
            f"{OURS}requests_waiting_for_kv",
            "Requests waiting in the router for KV pages on the decode workers", registry=r,
        )  # fmt: skip
        self.kv_wait = Histogram(
            f"{OURS}kv_wait_seconds", "Time a request waited for KV pages on the decode "
            "workers (requests that had to wait; however the wait ended)", registry=r,
            buckets=LATENCY_BUCKETS,
        )  # fmt: skip
        self.kv_bytes = Counter(
            f"{OURS}kv_transfer_bytes", "KV bytes moved to (write) / from (read) the pool",
            ("direction",), registry=r,
        )  # fmt: skip
        self.kv_seconds = Counter(
            f"{OURS}kv_transfer_seconds", "Time spent moving KV to (write) / from (read) the "
            "pool", ("direction",), registry=r,
        )  # fmt: skip
        self.role_changes = Counter(
            f"{OURS}role_changes", "Worker role changes by the P:D controller",
            ("from_role", "to_role", "result"), registry=r,
        )  # fmt: skip
        self.controller_leader = Gauge(
            f"{OURS}controller_leader", "1 while this router's P:D controller holds the lease "
            "and decides, else 0", registry=r,
        )  # fmt: skip
        self.workers = Gauge(f"{OURS}workers", "Live workers by role", ("role",), registry=r)
        self.slo_attainment = Gauge(
            f"{OURS}slo_attainment", "Share of the controller window's requests within the SLO",
            ("metric",), registry=r,
        )  # fmt: skip
        self.migrations = Counter(
            f"{OURS}migrations",
            "Requests moved to another decode worker after output began (the first failed)",
            ("from_worker", "to_worker"), registry=r,
        )  # fmt: skip
        self.handoffs = Counter(
            f"{OURS}kv_handoffs", "Disaggregated prompts by how their KV reached the decode "
            "worker (push, push_failed: the pool carried it, pool)", ("path",), registry=r,
        )  # fmt: skip
        self.index = IndexMetrics(r)
        """The prefix index's: KV event batches, predicted against actual local hits."""

    def observe_transfer(self, direction: str, transfer_bytes: int, seconds: float) -> None:
        self.kv_bytes.labels(direction).inc(transfer_bytes)
        self.kv_seconds.labels(direction).inc(max(0.0, seconds))

    def count_request(self, status: str) -> None:
        self.statuses.labels(status).inc()

    def request_counts(self) -> dict[str, int]:
        """``kvserve:requests_total`` as ``{status: requests}``, the statuses seen so far."""
        return {
            sample.labels["status"]: int(sample.value)
            for family in self.statuses.collect()
            for sample in family.samples
            if sample.name.endswith("_total")
        }

    def set_model(self, name: str) -> None:
        """The ``model_name`` of the request figures from now on (the workers' model)."""
        self.requests.model_name = name

    def update_roles(self, roles: Iterable[str]) -> None:
        """Set ``kvserve:workers`` from the live workers' roles (0 for a role with none)."""
        listed = list(roles)
        for role in ROLES:
            self.workers.labels(role).set(listed.count(role))

    def update_attainment(self, ttft: float | None, tpot: float | None) -> None:
        for metric, value in (("ttft", ttft), ("tpot", tpot)):
            self.slo_attainment.labels(metric).set(math.nan if value is None else value)

    def render(self) -> bytes:
        return generate_latest(self.registry)
