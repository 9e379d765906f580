"""Prometheus metrics of one router (one registry per app, never the global one).

Latency histograms carry ``mode`` (``disagg``: remote prefill then decode; ``local``: the
decode or mixed worker prefilled itself) and ``worker``: for TTFT the worker that made the
first token, for ITL and end-to-end the worker that decoded. ITL is observed once per
streamed chunk: the gap since the previous chunk divided by the chunk's tokens.
Worker gauges mirror the latest load report of each live worker (a worker that leaves
the registry leaves the gauges too). The P:D controller's figures: role changes by
outcome, live workers by role, and the SLO attainment of its window (NaN: too few samples).
Refusals: ``kvserve_requests_total{status="rejected"}`` counts every API request refused
before it ran (400, 404, 413, 429, 503); ``kvserve_admission_rejections_total`` the 429s of
admission control, by worker; ``kvserve_auth_failures_total`` the 401s of any route (no API
key, or a wrong one). Decode memory: ``kvserve_requests_waiting_for_kv`` is the number of
requests waiting now in the router's queue for KV pages on the decode workers
(:mod:`router.kv_wait`), and ``kvserve_kv_wait_seconds`` how long each request that had to
wait spent there, however its wait ended. Registry: ``kvserve_registry_rejected_records_total``
counts the values under the workers' keys in Redis that the router refused at a poll (each
poll that reads one counts it again): ``reason="mac"`` for no MAC or a wrong one (not
written with the cluster secret), ``reason="invalid"`` for a record out of the schema.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from proto import worker_pb2
from proto.records import ROLES
from router.index_metrics import IndexMetrics

LATENCY_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 600.0,
)  # fmt: skip
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 5.0)

WORKER_GAUGES = (
    "queued_prefill_tokens",
    "running",
    "waiting",
    "reserved",
    "free_pages",
    "total_pages",
    "prefill_tokens_per_s",
    "decode_tokens_per_s",
    "pool_connected",
    "pool_outages",
    "pool_forged_blocks",
    "pool_checksum_failures",
)


class RouterMetrics:
    """Lifecycle: one per app -> ``observe_*``/``count_*`` from request flows and
    :meth:`update_workers` from each registry poll -> :meth:`render` for ``/metrics``."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        labels = ("mode", "worker")
        self.ttft = Histogram(
            "kvserve_ttft_seconds", "Time to first token", labels, registry=r,
            buckets=LATENCY_BUCKETS,
        )  # fmt: skip
        self.itl = Histogram(
            "kvserve_itl_seconds", "Inter-token latency", labels, registry=r, buckets=ITL_BUCKETS
        )
        self.e2e = Histogram(
            "kvserve_e2e_seconds", "Request latency, end to end", labels, registry=r,
            buckets=LATENCY_BUCKETS,
        )  # fmt: skip
        self.prompt_tokens = Counter(
            "kvserve_prompt_tokens", "Prompt tokens by where their KV came from",
            ("source", "worker"), registry=r,
        )  # fmt: skip
        self.requests = Counter(
            "kvserve_requests", "Finished requests by status", ("status",), registry=r
        )
        self.admission_rejections = Counter(
            "kvserve_admission_rejections", "Requests refused (429) for a predicted TTFT over "
            "--admission-ttft-s, by the worker that would have prefilled", ("worker",), registry=r,
        )  # fmt: skip
        self.auth_failures = Counter(
            "kvserve_auth_failures", "HTTP requests refused (401) for a missing or wrong API key",
            registry=r,
        )  # fmt: skip
        self.registry_rejections = Counter(
            "kvserve_registry_rejected_records", "Worker records read from Redis and refused, "
            "by reason (mac: not written with the cluster secret; invalid: out of the schema)",
            ("reason",), registry=r,
        )  # fmt: skip
        self.kv_waiting = Gauge(
            "kvserve_requests_waiting_for_kv",
            "Requests waiting in the router for KV pages on the decode workers", registry=r,
        )  # fmt: skip
        self.kv_wait = Histogram(
            "kvserve_kv_wait_seconds", "Time a request waited for KV pages on the decode "
            "workers (requests that had to wait; however the wait ended)", registry=r,
            buckets=LATENCY_BUCKETS,
        )  # fmt: skip
        self.kv_bytes = Counter(
            "kvserve_kv_bytes", "KV bytes moved to/from the pool", ("direction",), registry=r
        )
        self.kv_seconds = Counter(
            "kvserve_kv_seconds", "Time spent moving KV to/from the pool", ("direction",),
            registry=r,
        )  # fmt: skip
        self.worker_gauges = {
            name: Gauge(f"kvserve_worker_{name}", f"Worker load report: {name}", ("worker",),
                        registry=r)
            for name in WORKER_GAUGES
        }  # fmt: skip
        self._workers: set[str] = set()
        self.role_changes = Counter(
            "kvserve_role_changes", "Worker role changes by the P:D controller",
            ("from_role", "to_role", "result"), registry=r,
        )  # fmt: skip
        self.workers = Gauge("kvserve_workers", "Live workers by role", ("role",), registry=r)
        self.slo_attainment = Gauge(
            "kvserve_slo_attainment", "Share of the controller window's requests within the SLO",
            ("metric",), registry=r,
        )  # fmt: skip
        self.index = IndexMetrics(r)
        """The prefix index's: KV event batches, predicted against actual local hits."""

    def observe_prefill(self, worker: str, usage: worker_pb2.PromptUsage) -> None:
        self.prompt_tokens.labels("local", worker).inc(usage.local_tokens)
        self.prompt_tokens.labels("pool", worker).inc(usage.pool_tokens)
        self.prompt_tokens.labels("computed", worker).inc(usage.computed_tokens)

    def observe_transfer(self, direction: str, transfer: worker_pb2.Transfer) -> None:
        self.kv_bytes.labels(direction).inc(transfer.bytes)
        self.kv_seconds.labels(direction).inc(max(0.0, transfer.seconds))

    def count_request(self, status: str) -> None:
        self.requests.labels(status).inc()

    def update_workers(self, loads: Iterable[tuple[str, dict[str, object]]]) -> None:
        """Set the worker gauges from ``(worker id, load report)`` pairs; drop the others."""
        seen: set[str] = set()
        for worker, load in loads:
            seen.add(worker)
            for name, gauge in self.worker_gauges.items():
                gauge.labels(worker).set(_number(load.get(name, 0)))
        for gone in self._workers - seen:
            for gauge in self.worker_gauges.values():
                gauge.remove(gone)
        self._workers = seen

    def update_roles(self, roles: Iterable[str]) -> None:
        """Set ``kvserve_workers`` from the live workers' roles (0 for a role with none)."""
        listed = list(roles)
        for role in ROLES:
            self.workers.labels(role).set(listed.count(role))

    def update_attainment(self, ttft: float | None, tpot: float | None) -> None:
        for metric, value in (("ttft", ttft), ("tpot", tpot)):
            self.slo_attainment.labels(metric).set(math.nan if value is None else value)

    def render(self) -> bytes:
        return generate_latest(self.registry)


def _number(value: object) -> float:
    """A load report field as a number (protobuf's JSON form writes 64-bit ints as text)."""
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return 0.0
