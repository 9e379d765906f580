"""API keys, tenants and cache salts at the HTTP edge (router.api.auth), exactly."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
from collections.abc import MutableMapping
from typing import Any

import pytest

from router.api import auth
from router.api.auth import (
    ApiKeyMiddleware,
    bare_key_tenant,
    bearer_token,
    effective_salt,
    parse_api_keys,
    request_salt,
    tenant_of,
    unauthorized,
)


def test_parse_keys_and_tenants() -> None:
    assert not parse_api_keys("").enabled
    assert not parse_api_keys("  ").enabled
    keys = parse_api_keys(" sk-shared , alice=sk-alice,bob=b=64==,sk-other")
    bare = bare_key_tenant(hashlib.sha256(b"sk-shared").digest())
    other = bare_key_tenant(hashlib.sha256(b"sk-other").digest())
    assert bare.startswith("~") and len(bare) == 17 and bare != other
    assert keys.enabled and keys.tenants == frozenset({bare, other, "alice", "bob"})
    assert keys.tenant_of("sk-shared") == bare and keys.tenant_of("sk-other") == other
    assert keys.tenant_of("sk-alice") == "alice"
    assert keys.tenant_of("b=64==") == "bob"  # the first "=" ends the tenant name
    for wrong in (None, "", "sk-alic", "sk-alicee", "alice=sk-alice", "SK-SHARED"):
        assert keys.tenant_of(wrong) is None, wrong


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("a,,b", "entry 2 is empty"),
        ("k1,", "entry 2 is empty"),
        ("bad name=secret1", "entry 1: a tenant name"),
        ("alice=", "entry 1: the key must be"),
        ("secret one", "entry 1: the key must be"),
        ("s\u00e9cret", "entry 1: the key must be"),
        ("secret1,alice=secret1", "entry 2 repeats"),
        (f"{'t' * 65}=secret1", "entry 1: a tenant name"),
    ],
)
def test_bad_keys_are_refused_without_echoing_them(text: str, match: str) -> None:
    with pytest.raises(ValueError, match=match) as info:
        parse_api_keys(text)
    assert "secret" not in str(info.value)


def test_every_key_is_compared_whatever_matched(monkeypatch: pytest.MonkeyPatch) -> None:
    keys = parse_api_keys("k-first,k-second,k-third")
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    assert keys.tenant_of("k-first") == bare_key_tenant(hashlib.sha256(b"k-first").digest())
    assert keys.tenant_of("nope") is None
    assert len(calls) == 6
    assert all(len(a) == len(b) == 32 for a, b in calls)  # digests: lengths leak nothing


def test_bearer_token() -> None:
    assert bearer_token("Bearer abc") == "abc"
    assert bearer_token("  bearer   abc  ") == "abc"
    for value in (None, "", "Bearer", "Bearer  ", "Basic abc", "abc"):
        assert bearer_token(value) is None, value


def test_effective_salt_separates_every_tenant_and_salt() -> None:
    assert effective_salt("", "") == ""
    assert effective_salt("", "s") == "\x00s"
    assert effective_salt("alice", "") == "alice\x00"
    assert effective_salt("alice", "s") == "alice\x00s"
    # an unnamed tenant cannot forge another tenant's salt through its cache_salt
    assert effective_salt("", "alice\x00s") != effective_salt("alice", "s")


def test_request_salt() -> None:
    alice = {"state": {auth.TENANT_STATE: "alice"}}
    assert request_salt(alice, None, isolate_tenants=True) == "alice\x00"
    assert request_salt(alice, "s", isolate_tenants=True) == "alice\x00s"
    assert request_salt(alice, None, isolate_tenants=False) == ""
    assert request_salt(alice, "s", isolate_tenants=False) == "\x00s"
    assert request_salt({}, None, isolate_tenants=True) == ""
    assert request_salt({"state": {}}, "", isolate_tenants=True) == ""


def test_unauthorized_error() -> None:
    err = unauthorized()
    assert err.status == 401 and err.headers == {"WWW-Authenticate": "Bearer"}
    assert err.body() == {
        "error": {
            "message": "Incorrect or missing API key: send it as 'Authorization: Bearer <key>'.",
            "type": "invalid_request_error",
            "param": None,
            "code": "invalid_api_key",
        }
    }


class Recorder:
    """A minimal ASGI app that records the scopes it is called with and answers 204."""

    def __init__(self) -> None:
        self.scopes: list[MutableMapping[str, Any]] = []

    async def __call__(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        self.scopes.append(scope)
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})


def call(app: Any, path: str, authorization: str | None = None) -> list[dict[str, Any]]:
    headers = [] if authorization is None else [(b"authorization", authorization.encode())]
    scope = {"type": "http", "path": path, "headers": headers, "state": {"shared": 1}}
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(dict(message))

    asyncio.run(app(scope, receive, send))
    return sent


def test_middleware_guards_every_path_but_health_and_the_status_page() -> None:
    inner, rejected = Recorder(), []
    app = ApiKeyMiddleware(inner, parse_api_keys("sk-shared,alice=sk-alice"),
                           on_reject=lambda: rejected.append(1))  # fmt: skip
    for path in ("/v1/completions", "/metrics", "/openapi.json", "/docs", "/v1/status"):
        start, body = call(app, path, "Bearer wrong")
        assert start["status"] == 401
        assert (b"www-authenticate", b"Bearer") in start["headers"]
        assert json.loads(body["body"]) == unauthorized().body()
    assert call(app, "/v1/models")[0]["status"] == 401  # no header at all
    assert not inner.scopes and len(rejected) == 6
    assert call(app, "/status.html")[0]["status"] == 401  # unknown: guarded (404 hidden)
    rejected.pop()
    for path in ("/health", "/", "/status.js", "/status.css"):
        assert call(app, path)[0]["status"] == 204
    assert call(app, "/v1/models", "Bearer sk-alice")[0]["status"] == 204
    assert call(app, "/v1/models", "Bearer sk-shared")[0]["status"] == 204
    shared = bare_key_tenant(hashlib.sha256(b"sk-shared").digest())
    assert [tenant_of(s) for s in inner.scopes] == ["", "", "", "", "alice", shared]
    assert inner.scopes[4]["state"] == {"shared": 1, auth.TENANT_STATE: "alice"}
    assert len(rejected) == 6


def test_middleware_without_keys_passes_everything() -> None:
    inner = Recorder()
    app = ApiKeyMiddleware(inner, parse_api_keys(""))
    assert call(app, "/v1/models")[0]["status"] == 204
    assert tenant_of(inner.scopes[0]) == ""
