"""The body of ``GET /v1/status``: what the status page (``GET /``) shows, in one answer.

Built from the router's own objects on each request, nothing kept here: the live workers
(:meth:`router.placement.worker_view.WorkerView.live`, their latest load reports), the cache
statistics (:meth:`router.observability.cache_stats.CacheStats.report`), the live TTFT / ITL windows
(:class:`router.observability.latency_window.LiveLatency`), the request counters
(:meth:`router.observability.metrics.RouterMetrics.request_counts`) and the P:D controller's report
(:meth:`router.control.controller.RoleController.report`). Every part is a pydantic model, so the
answer is validated when it is built and ``/openapi.json`` describes it exactly.

Conventions: times in seconds; a rate or share over nothing is ``null``; "last minute"
is the sliding 60 s window of the cache statistics and of the latency windows.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, Field

from router.observability.latency_window import LatencySummary
from router.placement.live_worker import LiveWorker, record_draining

if TYPE_CHECKING:  # the service imports nothing from here; kept out of import cycles
    from router.service import RouterService

DECISIONS = 10
"""The controller's decisions shown: the latest this many."""


class StatusRates(BaseModel):
    """Shares of prompt tokens (or of requests) by where their KV came from."""

    local: float | None = Field(description="From the worker's own prefix cache")
    pool: float | None = Field(description="Loaded from the shared KV pool")
    miss: float | None = Field(description="Computed (token rates); neither hit (requests)")


class StatusCacheWindow(BaseModel):
    """Prefills of one window, all workers (:mod:`router.observability.cache_stats`)."""

    requests: int
    prompt_tokens: int
    token_rates: StatusRates
    request_rates: StatusRates


class StatusCache(BaseModel):
    last_minute: StatusCacheWindow
    since_start: StatusCacheWindow
    pool_lookup: bool = Field(description="The router looks prefixes up in the pool")
    pool_connected: bool = Field(description="... and is connected to it now")


class StatusWorker(BaseModel):
    """A live worker, from its latest load report."""

    worker_id: str
    role: str = Field(description="prefill, decode or mixed")
    state: Literal["active", "draining", "held"] = Field(
        description="held: the router places no new work on it (the P:D controller is "
        "changing its role); draining: by its own report"
    )
    waiting: int
    running: int
    queued_prefill_tokens: int
    kv_pages_used: int
    kv_pages_total: int
    kv_use: float | None = Field(description="kv_pages_used / kv_pages_total")
    prefill_tokens_per_s: float
    decode_tokens_per_s: float
    requests: int = Field(description="Requests the worker has served since it started")
    hit_rates: StatusRates = Field(description="Token rates of its prefills, last minute")
    report_age_s: float = Field(description="Age of its load report (its clock)")


class StatusLatency(BaseModel):
    """TTFT and ITL as clients saw them over the last ``window_s`` seconds."""

    window_s: float
    ttft: LatencySummary
    itl: LatencySummary


class StatusDecision(BaseModel):
    """A role change that the P:D controller decided."""

    worker_id: str
    from_role: str
    to_role: str
    reason: str
    ago_s: float = Field(description="Seconds since it was decided")
    result: Literal["completed", "failed"] | None = Field(description="null: under way")
    error: str | None = None


class StatusController(BaseModel):
    """The P:D controller (``GET /v1/controller`` has all of it)."""

    enabled: bool
    verdict: str = Field(description="ok, ttft, tpot or both (under pressure)")
    ttft_attainment: float | None
    tpot_attainment: float | None
    ttft_slo_s: float
    tpot_slo_s: float
    target: float = Field(description="The attainment under which an SLO counts as missed")
    blocked: str | None = Field(description="Why the last evaluation moved nothing")
    cooldown_remaining_s: float
    decisions_total: int
    decisions: list[StatusDecision] = Field(description=f"The latest {DECISIONS}, newest first")


class StatusReport(BaseModel):
    """The body of ``GET /v1/status`` (module docstring)."""

    model: str | None = Field(description="The served model (null: no worker to name it)")
    serving: bool = Field(description="A decode-capable worker can take requests")
    uptime_s: float
    requests: dict[str, int] = Field(
        description="API requests since the start by how they ended (kvserve:requests_total)"
    )
    workers: list[StatusWorker]
    cache: StatusCache
    latency: StatusLatency
    controller: StatusController


def status_report(service: RouterService) -> StatusReport:
    """The router's status now (module docstring)."""
    cache = service.cache_stats.report()
    per_worker = cache["last_minute"]["workers"]
    no_prefill = {"local": None, "pool": None, "miss": None}
    now = time.time()
    workers = [
        worker_status(w, per_worker.get(w.worker_id, {}).get("token_rates", no_prefill), now)
        for w in service.view.live()
    ]
    latency = service.latency
    return StatusReport(
        model=service.model_name(),
        serving=bool(service.serving()),
        uptime_s=max(0.0, now - service.started_at),
        requests=service.metrics.request_counts(),
        workers=workers,
        cache=StatusCache(
            last_minute=StatusCacheWindow.model_validate(cache["last_minute"]["overall"]),
            since_start=StatusCacheWindow.model_validate(cache["since_start"]["overall"]),
            pool_lookup=service.config.pool_lookup,
            pool_connected=service.pool.connected,
        ),
        latency=StatusLatency(
            window_s=latency.window_s, ttft=latency.ttft.summary(), itl=latency.itl.summary()
        ),
        controller=controller_status(service.controller.report()),
    )


def worker_status(worker: LiveWorker, hit_rates: dict[str, Any], now: float) -> StatusWorker:
    """``worker`` as the page shows it; ``hit_rates``: its prefills' token rates;
    ``now``: the Unix time to age its report against."""
    load = worker.load()
    extra = worker.record.load.get
    state: Literal["active", "draining", "held"] = (
        "held" if worker.held else "draining" if record_draining(worker.record) else "active"
    )
    used = max(0, load.total_pages - load.free_pages)
    return StatusWorker(
        worker_id=worker.worker_id,
        role=worker.role,
        state=state,
        waiting=load.waiting,
        running=load.running,
        queued_prefill_tokens=load.queued_prefill_tokens,
        kv_pages_used=used,
        kv_pages_total=load.total_pages,
        kv_use=used / load.total_pages if load.total_pages else None,
        prefill_tokens_per_s=load.prefill_tokens_per_s,
        decode_tokens_per_s=float(extra("decode_tokens_per_s", 0.0)),
        requests=int(extra("requests", 0)),  # uint64: protobuf's JSON writes it as text
        hit_rates=StatusRates.model_validate(hit_rates),
        report_age_s=max(0.0, now - worker.record.heartbeat_at),
    )


def controller_status(report: dict[str, Any], last: int = DECISIONS) -> StatusController:
    """The page's part of :meth:`router.control.controller.RoleController.report`: its verdict and
    SLOs, and its ``last`` latest decisions, newest first, aged against its ``now_s``."""
    snapshot, config, history = report["snapshot"], report["config"], report["history"]
    decisions = [
        StatusDecision(
            worker_id=entry["worker_id"],
            from_role=entry["from_role"],
            to_role=entry["to_role"],
            reason=entry["reason"],
            ago_s=max(0.0, report["now_s"] - entry["at_s"]),
            result=entry["result"],
            error=entry.get("error"),
        )
        for entry in reversed(history[-last:] if last > 0 else [])
    ]
    return StatusController(
        enabled=report["enabled"],
        verdict=snapshot["verdict"],
        ttft_attainment=snapshot["ttft_attainment"],
        tpot_attainment=snapshot["tpot_attainment"],
        ttft_slo_s=config["ttft_slo_s"],
        tpot_slo_s=config["tpot_slo_s"],
        target=config["target"],
        blocked=snapshot["blocked"],
        cooldown_remaining_s=snapshot["cooldown_remaining_s"],
        decisions_total=len(history),
        decisions=decisions,
    )
