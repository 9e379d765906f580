"""``POST /v1/completions`` and ``POST /v1/chat/completions``: the request path.

Each route, in order: reads the body (:func:`read_body`: 415 unless it is JSON, 413 past
``max_body_bytes``),
parses it (:func:`router.api.openai_parse.parse_request`, 400), has :mod:`router.api.prepare`
check and tokenize it (every other refusal: 400, 404, 503), and :func:`answer`\\ s it:
placed and run by :meth:`RouterService.run` (429, 503), then sent whole as JSON or
streamed as server-sent events. A client that disconnects cancels the flow (499), which
aborts the request on every worker.
"""

from __future__ import annotations

import logging
import time

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from router.api import openapi
from router.api.edge import require_json
from router.api.openai_models import ChatCompletionRequest, CompletionRequest
from router.api.openai_parse import parse_request
from router.api.openapi import GENERATION_ERRORS, GENERATION_OK, openapi_body
from router.api.prepare import Preparer
from router.api.request_ids import given_request_id
from router.api.responses import Formatter
from router.api.streaming import ClientGoneError, collect, sse_events, until_disconnected
from router.errors import APIError
from router.flow.admitted import AdmittedRequest
from router.flow.samples import Sample, start_samples
from router.service import RouterService

log = logging.getLogger(__name__)


def generation_routes(service: RouterService, secured: bool) -> APIRouter:
    """The two generation routes over ``service`` (``secured``: API keys are required, as
    the OpenAPI document says)."""
    routes = APIRouter()
    preparer = Preparer(service)
    limit = service.config.max_body_bytes
    documented = openapi.responses(GENERATION_ERRORS, secured, GENERATION_OK)

    @routes.post(
        "/v1/completions",
        responses=documented,
        openapi_extra=openapi_body(CompletionRequest),
    )
    async def completions(request: Request) -> Response:
        started = time.monotonic()
        req = parse_request(CompletionRequest, await read_body(request, limit))
        return await answer(request, service, await preparer.prepare(req, request.scope, started))

    @routes.post(
        "/v1/chat/completions",
        responses=documented,
        openapi_extra=openapi_body(ChatCompletionRequest),
    )
    async def chat_completions(request: Request) -> Response:
        started = time.monotonic()
        req = parse_request(ChatCompletionRequest, await read_body(request, limit))
        return await answer(request, service, await preparer.prepare(req, request.scope, started))

    return routes


async def read_body(request: Request, limit: int) -> bytes:
    """The request body; 415 unless it is declared ``application/json``
    (:func:`router.api.edge.require_json`), 413 once it exceeds ``limit`` bytes (declared or
    actual)."""
    require_json(request.headers.get("content-type"))
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


async def answer(request: Request, service: RouterService, admitted: AdmittedRequest) -> Response:
    """Place and run ``admitted``'s samples (:mod:`router.flow.samples`); stream them or answer
    them whole. Errors of placement are the route's (counted as rejected); errors from a
    flow were counted by the flow."""
    given = given_request_id(request.scope)
    if given is not None:
        log.info("request %s has the client's X-Request-Id %r", admitted.request_id, given)
    headers = {"X-Request-Id": given or admitted.request_id}
    named = admitted.logprobs is not None or admitted.echo
    tokenizer = await service.tokenizer() if named else None
    samples = await start_samples(service, admitted)
    fmt = Formatter.of(admitted, tokenizer)
    try:
        if not admitted.stream:
            whole = await until_disconnected(request, collect(samples, admitted.n))
            return JSONResponse(fmt.response(whole), headers=headers)
        first: Sample = await until_disconnected(request, anext(samples))
    except ClientGoneError:
        await samples.aclose()
        return Response(status_code=499)
    except APIError as exc:
        exc.counted = True  # by the flow
        raise
    except StopAsyncIteration:
        raise APIError(502, "the worker returned nothing") from None
    return StreamingResponse(
        sse_events(first, samples, fmt, admitted.n),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", **headers},
    )
