"""The app's OpenAPI document: request bodies, error responses and API-key security.

The endpoints read raw bodies (so that a body over ``--max-body-bytes`` is refused before
it is parsed, and every error keeps OpenAI's format), hence FastAPI cannot infer them:

- :func:`openapi_body` declares an operation's JSON body as a request model, and
  :func:`install` puts those models (and the models they use) in ``components.schemas``;
- :func:`responses` documents the statuses an operation can answer, errors with
  :class:`ErrorResponse` (and ``Retry-After`` / ``WWW-Authenticate`` where they come);
- with API keys, :func:`install` adds a bearer ``securitySchemes`` entry and requires it on
  every operation but the open paths of :mod:`router.api.auth`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from router.api.auth import OPEN_PATHS
from router.api.openai_models import ChatCompletionRequest, CompletionRequest
from router.api.token_models import DetokenizeRequest, TokenizeRequest

SCHEMA_REF = "#/components/schemas/{model}"
SECURITY_SCHEME = "apiKey"

ERRORS = {
    400: "Invalid request (bad JSON, wrong types, values out of range, unsupported "
    "features, prompt + output over the context length; a Host this router does not serve)",
    401: "Missing or wrong API key (only when the router has API keys)",
    404: "Unknown model, or unknown path",
    413: "Request body over --max-body-bytes",
    415: "Request body not sent as Content-Type: application/json",
    429: "Admission control: the first token is predicted too late; retry after Retry-After",
    500: "Internal error",
    502: "A worker answered badly",
    503: "No worker can take the request now",
    504: "The request timed out",
}
HEADERS = {
    401: {"WWW-Authenticate": {"description": "Bearer", "schema": {"type": "string"}}},
    429: {
        "Retry-After": {
            "description": "Seconds to wait before retrying",
            "schema": {"type": "integer", "minimum": 1},
        }
    },
}
REQUEST_MODELS: tuple[type[BaseModel], ...] = (
    CompletionRequest,
    ChatCompletionRequest,
    TokenizeRequest,
    DetokenizeRequest,
)
GENERATION_ERRORS = (400, 404, 413, 415, 429, 500, 502, 503, 504)


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    """OpenAI's error body (:mod:`router.errors`)."""

    error: ErrorDetail


def openapi_schemas() -> dict[str, Any]:
    """``components.schemas`` entries for the request models and every model they use."""
    out: dict[str, Any] = {}
    for cls in REQUEST_MODELS:
        schema = cls.model_json_schema(ref_template=SCHEMA_REF)
        out.update(schema.pop("$defs", {}))
        out[cls.__name__] = schema
    return out


def openapi_body(cls: type[BaseModel]) -> dict[str, Any]:
    """An operation's ``openapi_extra``: a required JSON body of model ``cls``."""
    schema = {"$ref": SCHEMA_REF.format(model=cls.__name__)}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


def responses(
    errors: tuple[int, ...], secured: bool, ok: dict[str, Any] | None = None
) -> dict[int | str, dict[str, Any]]:
    """FastAPI ``responses=``: 200 (``ok``'s content when given), ``errors``, 500, and 401
    when ``secured``; each error with :class:`ErrorResponse`."""
    out: dict[int | str, dict[str, Any]] = {}
    if ok is not None:
        out[200] = {"description": "Successful Response", "content": ok}
    for status in sorted({*errors, 500, *((401,) if secured else ())}):
        entry: dict[str, Any] = {"description": ERRORS[status], "model": ErrorResponse}
        if status in HEADERS:
            entry["headers"] = HEADERS[status]
        out[status] = entry
    return out


SSE_EVENT = {
    "type": "object",
    "description": "One server-sent event (OpenAPI < 3.2: a text/event-stream schema describes "
    "each event): data is a JSON chunk, or [DONE] to end the stream",
    "properties": {"data": {"type": "string"}},
    "required": ["data"],
}
GENERATION_OK = {
    "application/json": {"schema": {"type": "object"}},
    "text/event-stream": {"schema": SSE_EVENT},
}


def install(app: FastAPI, secured: bool) -> None:
    """Make ``app.openapi()`` build the document described in the module docstring."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            doc = get_openapi(title=app.title, version=app.version, routes=app.routes)
            components = doc.setdefault("components", {})
            components.setdefault("schemas", {}).update(openapi_schemas())
            if secured:
                scheme = {"type": "http", "scheme": "bearer"}
                components["securitySchemes"] = {SECURITY_SCHEME: scheme}
                for path, operations in doc.get("paths", {}).items():
                    for operation in operations.values():
                        operation["security"] = (
                            [] if path in OPEN_PATHS else [{SECURITY_SCHEME: []}]
                        )
            app.openapi_schema = doc
        return app.openapi_schema

    setter: Callable[[], dict[str, Any]] = openapi
    app.openapi = setter  # type: ignore[method-assign]
