"""What the HTTP edge checks before any route, so that a web page in a browser cannot drive
the router (a cross-site request, or DNS rebinding onto ``127.0.0.1``).

Contract:

1. ``Host``: every HTTP request must name, in its ``Host`` header, an address this router
   serves (:func:`served_hosts`): its own bind address, the loopback names and the
   ``allowed_hosts`` setting (comma-separated names; ``*``: any). A router bound to every
   interface (``0.0.0.0``, ``::``) cannot know the names it is reached by: it takes any
   ``Host`` unless ``allowed_hosts`` lists them. Anything else is answered 400 in OpenAI's
   error format, code ``invalid_host``, before authentication and before the body is read.
   A page on another site that rebinds its own name to this machine sends that name, not
   one of ours. Names are compared without port, case, brackets or a trailing dot.
2. ``Content-Type``: a request body is read only as ``application/json``
   (:func:`require_json`; parameters such as ``charset`` allowed), else 415, code
   ``unsupported_media_type``. A page can send a cross-site POST without asking first only
   with a form's types (``text/plain``, ...); ``application/json`` makes the browser ask
   (CORS preflight), which the router never grants.

Pure Python: no third-party imports (raw ASGI, as :mod:`router.api.auth`).
"""

from __future__ import annotations

import re
from collections.abc import Callable

from router.api.auth import ASGIApp, Receive, Scope, Send, header_of, send_error
from router.errors import APIError

WILDCARD_BINDS = frozenset({"", "0.0.0.0", "::", "*"})
"""Bind addresses that listen on every interface."""
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
"""Names a client on the router's own machine may use; always served."""
_NAME = re.compile(r"[A-Za-z0-9_.\-:\[\]*]{1,253}")
_PORT = re.compile(r"[0-9]{1,5}")


def bare_host(name: str) -> str:
    """``name`` as compared: lower case, without IPv6 brackets or a trailing dot."""
    name = name.strip().lower()
    if name.startswith("[") and name.endswith("]"):
        name = name[1:-1]
    return name.rstrip(".") if name not in (".", "") else name


def check_allowed_hosts(text: str) -> None:
    """Raise ``ValueError`` naming the first entry of ``allowed_hosts`` that is no name."""
    for n, entry in enumerate(text.split(","), start=1):
        if entry.strip() and not _NAME.fullmatch(entry.strip()):
            raise ValueError(f"allowed_hosts entry {n} is not a host name or address")


def served_hosts(bind_host: str, allowed: str) -> frozenset[str] | None:
    """The names (:func:`bare_host`) a router bound to ``bind_host`` answers for, with the
    ``allowed_hosts`` setting ``allowed``; None: any (``*`` listed, or a wildcard bind with
    nothing listed)."""
    names = {bare_host(n) for n in allowed.split(",") if n.strip()}
    own = bare_host(bind_host)
    if "*" in names or (own in WILDCARD_BINDS and not names):
        return None
    return frozenset(names | LOOPBACK_NAMES | ({own} - WILDCARD_BINDS))


def host_name(value: str | None) -> str | None:
    """The name in a ``Host`` header value (:func:`bare_host`), or None when it is missing
    or malformed (``name[:port]`` or ``[v6]``\\ ``[:port]``)."""
    if value is None or not value.strip():
        return None
    value = value.strip()
    if value.startswith("["):
        name, _, rest = value.partition("]")
        name += "]"
        port = rest.removeprefix(":") if rest.startswith(":") else (None if rest else "")
    else:
        name, sep, port_text = value.partition(":")
        port = port_text if sep else ""
    if port is None or (port and not _PORT.fullmatch(port)) or not _NAME.fullmatch(name):
        return None
    return bare_host(name)


def invalid_host() -> APIError:
    """400 for a request whose ``Host`` names no address this router serves."""
    return APIError(
        400,
        "the Host header names no address this router serves (the router's "
        "--allowed-hosts lists the names it may be reached by)",
        None,
        "invalid_host",
    )


def require_json(content_type: str | None) -> None:
    """415 unless ``content_type`` (a ``Content-Type`` header value) is ``application/json``
    (with any parameters)."""
    media = (content_type or "").split(";", 1)[0].strip().lower()
    if media != "application/json":
        raise APIError(
            415,
            "send the request body as JSON, with 'Content-Type: application/json'",
            None,
            "unsupported_media_type",
        )


class HostCheckMiddleware:
    """Raw ASGI middleware answering 400 to a request whose ``Host`` is not in ``hosts``
    (None: every request passes); ``on_reject`` is called once per refused request."""

    def __init__(
        self,
        app: ASGIApp,
        hosts: frozenset[str] | None,
        on_reject: Callable[[], None] | None = None,
    ) -> None:
        self.app, self.hosts, self.on_reject = app, hosts, on_reject

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.hosts is None:
            await self.app(scope, receive, send)
            return
        if host_name(header_of(scope, b"host")) not in self.hosts:
            if self.on_reject is not None:
                self.on_reject()
            await send_error(send, invalid_host())
            return
        await self.app(scope, receive, send)
