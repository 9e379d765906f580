"""The OpenAI-compatible HTTP API.

Lifecycle of an app from :func:`create_app`:

1. lifespan start: the :class:`RouterService` joins the pool for lookups (optional),
   starts watching the worker registry and (``--controller``) the P:D ratio controller;
2. per request: with ``--api-key``, the key is checked first (401, :mod:`router.auth`; every
   route but ``/health``, the OpenAPI docs included); the body is read (413 past
   ``max_body_bytes``), parsed and checked (400), the model checked (404, or 503 with no
   worker), the prompt tokenized (in a thread, :meth:`router.tokenizer.TokenizerSlot.off_loop`)
   and its length checked (400), all before any worker is called; then placed (429 from
   admission control, :mod:`router.admission`) under the request's cache salt (its
   tenant's, with ``--isolate-tenants``, and its ``cache_salt``) and run as a flow;
3. streamed answers are server-sent events; a client that disconnects, before or after
   the first event, cancels the flow, which aborts the request on every worker;
4. lifespan end: the registry watch stops, channels close, the pool is left.

Every error body is OpenAI's ``{"error": {"message", "type", "param", "code"}}``; a 500 says
nothing of its cause (logged instead). ``/openapi.json`` describes the real request bodies
and error responses (:mod:`router.openapi`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from kvpool.config import PoolConfig
from proto.registry import ClusterConfig
from router import openapi
from router.auth import ApiKeyMiddleware, request_salt
from router.config import RouterConfig
from router.errors import APIError, invalid
from router.flow_types import Chunk
from router.openai_models import (
    ChatCompletionRequest,
    CompletionRequest,
    SamplingFields,
    parse_request,
)
from router.openapi import GENERATION_ERRORS, GENERATION_OK, openapi_body
from router.pool_stats import pool_stats
from router.responses import Formatter
from router.service import RouterService
from router.streaming import ClientGoneError, collect, sse_events, until_disconnected

log = logging.getLogger(__name__)
JSON_OK = {"application/json": {"schema": {"type": "object"}}}


def create_app(router: RouterConfig, cluster: ClusterConfig, pool: PoolConfig) -> FastAPI:
    """The router's ASGI app; ``app.state.service`` is its :class:`RouterService`."""
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
    openapi.install(app, secured=keys.enabled)
    generation = openapi.responses(GENERATION_ERRORS, keys.enabled, GENERATION_OK)
    reads = openapi.responses((), keys.enabled)

    def salt(request: Request, req: SamplingFields) -> str:
        return request_salt(request.scope, req.cache_salt, router.isolate_tenants)

    @app.post(
        "/v1/completions",
        responses=generation,
        openapi_extra=openapi_body(CompletionRequest),
    )
    async def completions(request: Request) -> Response:
        started = time.monotonic()
        req = parse_request(CompletionRequest, await read_body(request, router.max_body_bytes))
        req.check()
        service.check_model(req.model)
        tok = await service.tokenizer()
        ids = req.prompt_input()
        if isinstance(ids, str):
            ids = await service.tokenizers.off_loop(tok.encode, ids)
        if any(t >= tok.vocab_size for t in ids):
            raise invalid(f"token ids must be below {tok.vocab_size}", "prompt", "invalid_value")
        max_tokens = service.check_length(len(ids), req.max_tokens or 16, "prompt")
        return await _run(request, service, req, ids, (max_tokens, started, salt(request, req)))

    @app.post(
        "/v1/chat/completions",
        responses=generation,
        openapi_extra=openapi_body(ChatCompletionRequest),
    )
    async def chat_completions(request: Request) -> Response:
        started = time.monotonic()
        body = await read_body(request, router.max_body_bytes)
        req = parse_request(ChatCompletionRequest, body)
        req.check()
        service.check_model(req.model)
        tok = await service.tokenizer()
        try:
            messages = [m.to_template() for m in req.messages]
            ids = await service.tokenizers.off_loop(tok.encode_chat, messages)
        except ValueError as exc:
            raise invalid(str(exc), "messages") from None
        max_tokens = service.check_length(len(ids), req.output_limit, "messages")
        return await _run(request, service, req, ids, (max_tokens, started, salt(request, req)))

    @app.get("/v1/models", responses=reads)
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

    health_docs: dict[int | str, dict[str, Any]] = {
        200: {
            "description": "A decode-capable worker is registered and the tokenizer is loaded",
            "content": JSON_OK,
        },
        503: {
            "description": "No decode-capable worker is registered, or the tokenizer is loading",
            "content": JSON_OK,
        },
    }

    @app.get("/health", responses=health_docs)
    async def health() -> JSONResponse:
        if not service.serving():
            reason = f"no decode-capable worker is registered in cluster {cluster.cluster!r}"
        elif service.tokenizers.loading:
            reason = "loading the tokenizer"
        else:
            return JSONResponse({"status": "ok", "workers": len(service.view.live())})
        return JSONResponse({"status": "unavailable", "reason": reason}, status_code=503)

    text = {"text/plain": {"schema": {"type": "string"}}}

    @app.get("/metrics", responses=openapi.responses((), keys.enabled, text))
    async def metrics() -> Response:
        return Response(service.render_metrics(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/controller", responses=reads)
    async def controller() -> dict[str, Any]:
        """The P:D controller: settings, SLO window, streaks, every change and its result."""
        return service.controller.report()

    @app.get("/v1/cache/stats", responses=reads)
    async def cache_stats() -> dict[str, Any]:
        out = service.cache_stats.report()
        out["pool_lookup"] = {"enabled": router.pool_lookup, "connected": service.pool.connected}
        if router.master_metrics_url:
            out["pool"] = await pool_stats(router.master_metrics_url)
        return out

    return app


async def read_body(request: Request, limit: int) -> bytes:
    """The request body; 413 once it exceeds ``limit`` bytes (declared or actual)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    body = bytearray()
    async for part in request.stream():
        body += part
        if len(body) > limit:
            raise _too_large(limit)
    return bytes(body)


def _too_large(limit: int) -> APIError:
    return APIError(413, f"request body exceeds {limit} bytes", None, "request_too_large")


async def _run(
    request: Request,
    service: RouterService,
    req: SamplingFields,
    ids: list[int],
    run: tuple[int, float, str],
) -> Response:
    """Place and run the request; stream it or answer it whole. ``run``: its output limit,
    when it arrived (monotonic) and its cache salt."""
    max_tokens, started, cache_salt = run
    chat = isinstance(req, ChatCompletionRequest)
    params = req.wire_params(max_tokens)
    plan = await service.plan(ids, params, started, cache_salt=cache_salt)
    prefix = "chatcmpl-" if chat else "cmpl-"
    fmt = Formatter(chat, prefix + plan.request_id, req.model, req.include_usage)
    chunks = service.flow(plan).chunks()
    try:
        if not req.stream:
            text, finish, usage = await until_disconnected(request, collect(chunks))
            return JSONResponse(fmt.response(text, finish, usage))
        first: Chunk = await until_disconnected(request, anext(chunks))
    except ClientGoneError:
        return Response(status_code=499)
    except APIError as exc:
        exc.counted = True  # by the flow
        raise
    except StopAsyncIteration:
        raise APIError(502, "the worker returned nothing") from None
    return StreamingResponse(
        sse_events(first, chunks, fmt),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Request-Id": plan.request_id},
    )


def _add_error_handlers(app: FastAPI) -> None:
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
        return JSONResponse(err.body(), status_code=500)

    app.add_exception_handler(APIError, api_error)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(Exception, internal_error)
