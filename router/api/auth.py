"""Optional API keys at the HTTP edge (``--api-key``, env ``KVSERVE_API_KEY``).

Contract:

1. ``--api-key`` is empty (no authentication) or one or several comma-separated entries;
   an entry is a key, or ``tenant=key`` to name the key's tenant. A bare key is a tenant
   of its own (:func:`bare_key_tenant`: no two keys share it, no named tenant is spelled
   so); keys that are to share a prefix cache on purpose are given one tenant name
   (``team=key1,team=key2``). The first ``=`` ends the tenant name, so a key that itself contains
   ``=`` (padded base64) must be written with its tenant. Tenant names are 1-64 of
   ``A-Z a-z 0-9 _ . -``; keys are visible ASCII without ``,``; a key may appear once.
2. With keys, every HTTP request except ``GET /health`` (load-balancer probes) and the
   status page's files (:data:`STATUS_PAGE`: static, they hold no data) must carry
   ``Authorization: Bearer <key>``; the API, ``/metrics``, ``/v1/models``,
   ``/v1/cache/stats``, ``/v1/controller``, ``/v1/status`` (the page's data) and the
   OpenAPI docs (``/openapi.json``, ``/docs``, ``/redoc``) are all covered, and so are
   unknown paths (a 401 reveals no route). Anything else is answered 401 in OpenAI's
   error format, code ``invalid_api_key``, with ``WWW-Authenticate: Bearer``, before the
   body is read.
3. Keys are compared in constant time: the presented token and every configured key are
   hashed (SHA-256, so lengths leak nothing) and compared with :func:`hmac.compare_digest`
   against every key, without an early exit.
4. The accepted key's tenant is put in the request's state (:func:`tenant_of` reads it);
   :func:`request_salt` makes it, with the body's ``cache_salt``, the request's cache salt.

Keys are never logged or echoed: the 401 message does not repeat what was presented.
Pure Python: no third-party imports (the middleware speaks raw ASGI).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from router.errors import APIError

STATUS_PAGE = {"/": "status.html", "/status.js": "status.js", "/status.css": "status.css"}
"""The status page: path -> its file in ``router/api/static`` (:mod:`router.api.routes.page`).
Public: a browser cannot send a key with a page load, and the files hold no data; the
page's script asks for a key and sends it to ``/v1/status``."""
OPEN_PATHS = frozenset({"/health", *STATUS_PAGE})
TENANT_STATE = "kvserve_tenant"
_TENANT_RE = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
_KEY_RE = re.compile(r"[\x21-\x2b\x2d-\x7e]+")  # visible ASCII except ","

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("latin-1", "replace")).digest()


@dataclass(frozen=True)
class ApiKeys:
    """The configured keys (SHA-256 digests) and their tenants; empty: no authentication."""

    entries: tuple[tuple[bytes, str], ...] = field(default=(), repr=False)

    @property
    def enabled(self) -> bool:
        return bool(self.entries)

    @property
    def tenants(self) -> frozenset[str]:
        return frozenset(tenant for _, tenant in self.entries)

    def tenant_of(self, token: str | None) -> str | None:
        """The tenant of ``token``, or None when it matches no key.

        Every configured key is compared, whatever matched before (constant time)."""
        presented = _digest(token or "")
        found: str | None = None
        for digest, tenant in self.entries:
            if hmac.compare_digest(presented, digest):
                found = tenant
        return found


def bare_key_tenant(digest: bytes) -> str:
    """The tenant of a key given without one, from its SHA-256 ``digest``: ``~`` and 16 hex
    digits (a character no tenant name holds, so it is never a named tenant's; the key is
    not recoverable from it). Its own, so that one key holder's ``cached_tokens`` tell
    nothing of another's prompts (with :attr:`RouterConfig.isolate_tenants`)."""
    return "~" + digest.hex()[:16]


def parse_api_keys(text: str) -> ApiKeys:
    """The keys of ``--api-key`` (module docstring, 1.); ValueError names the bad entry by
    position, never by content."""
    entries: list[tuple[bytes, str]] = []
    seen: set[str] = set()
    for n, raw in enumerate(text.split(","), start=1):
        entry = raw.strip()
        if not entry:
            if text.strip():
                raise ValueError(f"api_key entry {n} is empty (entries are comma-separated)")
            continue
        tenant, sep, key = entry.partition("=")
        if not sep:
            tenant, key = "", entry
        elif not _TENANT_RE.fullmatch(tenant):
            raise ValueError(f"api_key entry {n}: a tenant name is 1-64 of A-Z a-z 0-9 _ . -")
        if not _KEY_RE.fullmatch(key):
            raise ValueError(f"api_key entry {n}: the key must be visible ASCII without ','")
        if key in seen:
            raise ValueError(f"api_key entry {n} repeats an earlier key")
        seen.add(key)
        digest = _digest(key)
        entries.append((digest, tenant or bare_key_tenant(digest)))
    return ApiKeys(tuple(entries))


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header value (scheme: any case)."""
    if authorization is None:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def unauthorized() -> APIError:
    """401 as OpenAI answers a missing or wrong key (the key itself is not repeated)."""
    return APIError(
        401,
        "Incorrect or missing API key: send it as 'Authorization: Bearer <key>'.",
        None,
        "invalid_api_key",
        headers={"WWW-Authenticate": "Bearer"},
    )


def effective_salt(tenant: str, cache_salt: str) -> str:
    """The salt of a request's pool keys: ``""`` when both are empty, else
    ``tenant + NUL + cache_salt``. Tenant names hold no NUL, so two different
    (tenant, cache_salt) pairs never share a salt."""
    return f"{tenant}\x00{cache_salt}" if tenant or cache_salt else ""


def tenant_of(scope: Scope) -> str:
    """The tenant that :class:`ApiKeyMiddleware` accepted for this request (``""``: none)."""
    return str(scope.get("state", {}).get(TENANT_STATE, ""))


def request_salt(scope: Scope, cache_salt: str | None, isolate_tenants: bool) -> str:
    """The cache salt of a request: :func:`effective_salt` of its tenant (when
    ``isolate_tenants``, else none) and its body's ``cache_salt``."""
    return effective_salt(tenant_of(scope) if isolate_tenants else "", cache_salt or "")


class ApiKeyMiddleware:
    """Raw ASGI middleware enforcing :class:`ApiKeys` on HTTP requests (module docstring).

    ``on_reject`` is called once per refused request (for the metrics). Scopes other than
    ``http`` (lifespan; there are no websocket routes) pass through untouched."""

    def __init__(
        self, app: ASGIApp, keys: ApiKeys, on_reject: Callable[[], None] | None = None
    ) -> None:
        self.app, self.keys, self.on_reject = app, keys, on_reject

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.keys.enabled or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        tenant = self.keys.tenant_of(bearer_token(header_of(scope, b"authorization")))
        if tenant is None:
            if self.on_reject is not None:
                self.on_reject()
            await send_error(send, unauthorized())
            return
        scope["state"] = {**scope.get("state", {}), TENANT_STATE: tenant}
        await self.app(scope, receive, send)


def header_of(scope: Scope, name: bytes) -> str | None:
    """The value of header ``name`` (lower case) in an ASGI ``scope``, or None."""
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return bytes(value).decode("latin-1")
    return None


async def send_error(send: Send, err: APIError) -> None:
    """Answer ``err`` in OpenAI's error format on a raw ASGI ``send``."""
    body = json.dumps(err.body()).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode(), v.encode("latin-1")) for k, v in err.headers.items()]
    await send({"type": "http.response.start", "status": err.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
