"""The OpenAI-compatible HTTP API.

Lifecycle of an app from :func:`create_app`:

1. lifespan start: the :class:`RouterService` joins the pool for lookups (optional),
   starts watching the worker registry and (``--controller``) the P:D ratio controller;
2. per request: a client's ``X-Request-Id`` is kept and echoed on every response
   (:mod:`router.api.request_ids`); the ``Host`` header must name an address the router
   serves (400, :mod:`router.api.edge`); with ``--api-key``, the key is checked next (401,
   :mod:`router.api.auth`; every route but ``/health``, the OpenAPI docs included); then the
   route of its family (:mod:`router.api.routes`). A generation request is read (415 unless
   its ``Content-Type`` is ``application/json``, 413 past ``max_body_bytes``) and parsed
   (400), then :mod:`router.api.prepare` checks everything else
   in one place (fields, model, tokenization, vocabulary, length: 400, 404, 503) before any
   worker is called; then it is placed (429 from admission control,
   :mod:`router.placement.admission`) under the request's cache salt (its tenant's, with
   ``--isolate-tenants``, and its ``cache_salt``) and run as a flow
   (:mod:`router.api.routes.generation`);
3. streamed answers are server-sent events; a client that disconnects, before or after
   the first event, cancels the flow, which aborts the request on every worker;
4. lifespan end: the registry watch stops, channels close, the pool is left.

Every response the app sends carries ``X-Kvserve-Router: <router id>``
(:data:`ROUTER_HEADER`, :class:`RouterHeaderMiddleware`; a 500 too): which of several
routers behind a balancer answered. (uvicorn's own answers, such as its 503 past
``max_connections``, never reach the app and carry no header.)

Every error body is OpenAI's ``{"error": {"message", "type", "param", "code"}}``; a 500 says
nothing of its cause (logged instead). ``/openapi.json`` describes the real request bodies
and error responses (:mod:`router.api.openapi`).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.datastructures import MutableHeaders
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kvpool.config import PoolConfig
from proto.registry import ClusterConfig
from router.api import openapi
from router.api.auth import ApiKeyMiddleware
from router.api.edge import HostCheckMiddleware
from router.api.request_ids import RequestIdMiddleware
from router.api.routes.generation import generation_routes
from router.api.routes.info import info_routes
from router.api.routes.ops import ops_routes
from router.api.routes.page import page_routes
from router.api.routes.tokens import token_routes
from router.config import RouterConfig
from router.errors import APIError
from router.service import RouterService

log = logging.getLogger(__name__)

ROUTER_HEADER = "X-Kvserve-Router"
"""The response header naming the router that answered (its resolved ``--router-id``)."""


class RouterHeaderMiddleware:
    """Adds :data:`ROUTER_HEADER` to every HTTP response (pure ASGI: streams pass through
    as they are)."""

    def __init__(self, app: ASGIApp, router_id: str) -> None:
        self.app = app
        self.router_id = router_id

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_router(message: Message) -> None:
            if message["type"] == "http.response.start":
                name_router(MutableHeaders(scope=message), self.router_id)
            await send(message)

        await self.app(scope, receive, send_with_router)


def name_router(headers: MutableHeaders, router_id: str) -> None:
    """Set :data:`ROUTER_HEADER` in ``headers`` to ``router_id``, the name spelled as
    :data:`ROUTER_HEADER` is (Starlette would lowercase it; h11 sends it as given)."""
    del headers[ROUTER_HEADER]
    headers.raw.append((ROUTER_HEADER.encode("latin-1"), router_id.encode("latin-1")))


def create_app(router: RouterConfig, cluster: ClusterConfig, pool: PoolConfig) -> FastAPI:
    """The router's ASGI app; ``app.state.service`` is its :class:`RouterService`. Its
    routes come from :mod:`router.api.routes`, one module per family."""
    service = RouterService(router, cluster, pool)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await service.start()
        try:
            yield
        finally:
            await service.stop()

    app = FastAPI(title="kvserve router", lifespan=lifespan)
    app.state.service = service
    _add_error_handlers(app)
    keys = router.api_keys
    if keys.enabled:
        app.add_middleware(ApiKeyMiddleware, keys=keys, on_reject=service.metrics.auth_failures.inc)
    refused = service.metrics.host_refusals.inc
    app.add_middleware(HostCheckMiddleware, hosts=router.served_hosts, on_reject=refused)
    app.add_middleware(RequestIdMiddleware)
    app.add_middleware(RouterHeaderMiddleware, router_id=service.router_id)  # the outermost
    openapi.install(app, secured=keys.enabled)
    for routes in (generation_routes, info_routes, ops_routes, token_routes):
        app.include_router(routes(service, keys.enabled))
    app.include_router(page_routes())
    return app


def _add_error_handlers(app: FastAPI) -> None:
    """Every error as OpenAI's body: :class:`APIError` as raised (counted as a rejected
    request unless the flow counted it), Starlette's (404, 405...) with their status, any
    other exception as a 500 that names no cause."""
    service: RouterService = app.state.service

    async def api_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, APIError)
        if not exc.counted:
            service.metrics.count_request("rejected")
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    async def http_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        code = "not_found" if exc.status_code == 404 else None
        err = APIError(exc.status_code, str(exc.detail), None, code)
        return JSONResponse(err.body(), status_code=exc.status_code, headers=exc.headers)

    async def internal_error(request: Request, exc: Exception) -> Response:
        # The cause stays in the log: exception texts can hold paths, addresses, secrets.
        log.error("internal error on %s %s", request.method, request.url.path, exc_info=exc)
        err = APIError(500, "internal server error (the router's log has the cause)")
        response = JSONResponse(err.body(), status_code=500)
        # (sent by Starlette's outermost middleware, past RouterHeaderMiddleware)
        name_router(response.headers, service.router_id)
        return response

    app.add_exception_handler(APIError, api_error)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(Exception, internal_error)
