"""``GET /v1/models`` (the served model) and ``GET /health`` (ready to serve or not)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from starlette.responses import JSONResponse

from router.api import openapi
from router.service import RouterService

JSON_OK = {"application/json": {"schema": {"type": "object"}}}
HEALTH_DOCS: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "A decode-capable worker is registered and the tokenizer is loaded",
        "content": JSON_OK,
    },
    503: {
        "description": "No decode-capable worker is registered, or the tokenizer is loading",
        "content": JSON_OK,
    },
}


def info_routes(service: RouterService, secured: bool) -> APIRouter:
    """``/v1/models`` (behind the API keys when ``secured``) and ``/health`` (always open:
    :data:`router.api.auth.OPEN_PATHS`). ``/v1/models`` lists the served model (none while no
    worker is registered to name it); ``/health`` answers 200 with the live worker count,
    503 with the reason while the router cannot serve. (A route's docstring would become
    its OpenAPI description: these have none.)"""
    routes = APIRouter()

    @routes.get("/v1/models", responses=openapi.responses((), secured))
    async def models() -> dict[str, Any]:
        name = service.model_name()
        data = [
            {
                "id": name,
                "object": "model",
                "created": service.started_at,
                "owned_by": "kvserve",
                "max_model_len": service.max_model_len(),
            }
        ]
        return {"object": "list", "data": data if name else []}

    @routes.get("/health", responses=HEALTH_DOCS)
    async def health() -> JSONResponse:
        if not service.serving():
            reason = (
                f"no decode-capable worker is registered in cluster {service.cluster.cluster!r}"
            )
        elif service.tokenizers.loading:
            reason = "loading the tokenizer"
        else:
            return JSONResponse({"status": "ok", "workers": len(service.view.live())})
        return JSONResponse({"status": "unavailable", "reason": reason}, status_code=503)

    return routes
