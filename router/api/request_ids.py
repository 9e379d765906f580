"""``X-Request-Id``: a client's own id for its request, accepted, echoed and logged.

:class:`RequestIdMiddleware` (pure ASGI) reads the header of every HTTP request; a valid
one (:func:`client_request_id`: 1 to :data:`MAX_CHARS` visible ASCII characters) is kept
in the request's state (``client_request_id``) and echoed on the response. A response
without it gets the route's id (a generation answer's: the router's own request id) or a
fresh one, so every response carries one. An invalid header is ignored (logged): the
router's ids stay its own (uuid4 hex), never a client's; the generation route logs which
client id a request of its own id came with.
"""

from __future__ import annotations

import logging
import re
import uuid

from starlette.datastructures import Headers, MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger(__name__)

MAX_CHARS = 128
_VALID = re.compile(rf"[\x21-\x7e]{{1,{MAX_CHARS}}}")
STATE_KEY = "client_request_id"


def client_request_id(scope: Scope) -> str | None:
    """The request's valid ``X-Request-Id`` header, or None (absent or invalid)."""
    given = Headers(scope=scope).get("x-request-id")
    if given is None:
        return None
    if _VALID.fullmatch(given):
        return given
    log.info("ignored an invalid X-Request-Id header (%d characters)", len(given))
    return None


def given_request_id(scope: Scope) -> str | None:
    """The client's id the middleware kept for this request, if any."""
    state = scope.get("state") or {}
    value = state.get(STATE_KEY)
    return value if isinstance(value, str) else None


class RequestIdMiddleware:
    """Keeps and echoes a client's ``X-Request-Id`` (module docstring)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = client_request_id(scope)
        if given is not None:
            scope.setdefault("state", {})[STATE_KEY] = given

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                if given is not None:
                    headers["X-Request-Id"] = given
                elif "x-request-id" not in headers:
                    headers["X-Request-Id"] = uuid.uuid4().hex
            await send(message)

        await self.app(scope, receive, send_with_id)
