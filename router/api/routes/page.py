"""The status page: ``GET /`` (HTML), ``/status.js`` and ``/status.css``, from
``router/api/static`` (package data). Plain files, no build step; the script polls
``GET /v1/status`` (:mod:`router.api.routes.ops`) and draws the answer.

The files are public (:data:`router.api.auth.STATUS_PAGE`) and hold no data. With API keys,
the script asks for a key when ``/v1/status`` answers 401, keeps it in the tab's
``sessionStorage`` and sends it as ``Authorization: Bearer``. Every file is sent with a
Content-Security-Policy that allows only this origin's script, style and requests (no
inline script, no third party), so an injected string could neither run nor send the key
elsewhere; the script also inserts server text as text only, never as HTML."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from importlib import resources
from pathlib import PurePosixPath

from fastapi import APIRouter
from starlette.responses import Response

from router.api.auth import STATUS_PAGE

MEDIA_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
}
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
    "connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
    "Referrer-Policy": "no-referrer",
}


def page_file(name: str) -> bytes:
    """The bytes of ``router/api/static/<name>``."""
    return resources.files("router.api").joinpath("static", name).read_bytes()


def page_routes() -> APIRouter:
    """One route per :data:`STATUS_PAGE` entry, its file read once, here. Not in the
    OpenAPI document: they are no API (as FastAPI's own ``/docs`` is not)."""
    routes = APIRouter()
    for path, name in STATUS_PAGE.items():
        serve = _server(page_file(name), MEDIA_TYPES[PurePosixPath(name).suffix])
        routes.add_api_route(path, serve, methods=["GET"], include_in_schema=False)
    return routes


def _server(body: bytes, media_type: str) -> Callable[[], Awaitable[Response]]:
    """An endpoint (no parameters) that answers ``body``."""

    async def serve() -> Response:
        return Response(body, media_type=media_type, headers=HEADERS)

    return serve
