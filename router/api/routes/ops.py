"""Operations: ``GET /metrics`` (Prometheus), ``GET /v1/controller`` (the P:D
controller, with its lease: ``{"holder", "held_here"}``), ``GET /v1/cache/stats`` (prefix
cache and pool statistics, and ``"router"``: the id of the router that answered, whose
own traffic they count) and ``GET /v1/status`` (what the status page shows,
:mod:`router.api.status`)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.responses import Response

from router.api import openapi
from router.api.status import StatusReport, status_report
from router.observability.pool_stats import pool_stats
from router.service import RouterService

TEXT = {"text/plain": {"schema": {"type": "string"}}}


def ops_routes(service: RouterService, secured: bool) -> APIRouter:
    """The four routes over ``service`` (behind the API keys when ``secured``):
    :meth:`RouterService.render_metrics`; the controller's report; the cache statistics
    with the pool lookup's state and (``--master-metrics-url``) the pool master's; the
    status report. Only ``/v1/controller`` and ``/v1/status`` have a docstring: it is
    their OpenAPI description."""
    routes = APIRouter()
    reads = openapi.responses((), secured)
    config = service.config

    @routes.get("/metrics", responses=openapi.responses((), secured, TEXT))
    async def metrics() -> Response:
        return Response(service.render_metrics(), media_type=CONTENT_TYPE_LATEST)

    @routes.get("/v1/controller", responses=reads)
    async def controller() -> dict[str, Any]:
        """The P:D controller: settings, SLO window, streaks, every change and its result,
        and its lease: who holds it now (null: nobody, or Redis unreachable) and whether
        this router does (it decides)."""
        await service.controller.observe_lease()
        return service.controller.report()

    @routes.get("/v1/cache/stats", responses=reads)
    async def cache_stats() -> dict[str, Any]:
        out = {"router": service.router_id, **service.cache_stats.report()}
        out["pool_lookup"] = {"enabled": config.pool_lookup, "connected": service.pool.connected}
        if service.pool_config.master_metrics_url:
            out["pool"] = await pool_stats(service.pool_config.master_metrics_url)
        return out

    @routes.get("/v1/status", responses=reads)
    async def status() -> StatusReport:
        """What the status page shows: the workers (role, state, queue, KV use), cache hit
        rates, live TTFT / ITL, request counts and the P:D controller's latest decisions."""
        return status_report(service)

    return routes
