"""The router's HTTP edge through real HTTP and stub workers: bad input refused before any
worker call, API keys, tenant cache salts, token ids returned through the disaggregated
path, and admission control (429).

``harness``: a router with three keys (one unnamed, tenants ``alice`` and ``bob``); its
requests carry the first key unless a test says otherwise.
Admission runs on a router of its own with a 10 s limit, whose prefill stub reports 500
queued tokens at 100 tokens/s and whose decode stub has no measured speed (so its local
prefills are never refused). See :mod:`tests.integration.router_harness`.
"""

from __future__ import annotations

import hashlib
import http.client
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from router.api.auth import bare_key_tenant, unauthorized
from tests.integration.router_harness import (
    MODEL,
    Harness,
    StubWorker,
    out_token,
    running_redis,
)

KEYS = "sk-shared,alice=sk-alice,bob=sk-bob"
GUARDED = ("/v1/models", "/metrics", "/v1/cache/stats", "/v1/controller", "/openapi.json",
           "/docs", "/redoc", "/nowhere")  # fmt: skip


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running_redis(tmp_path_factory.mktemp("redis")) as url:
        yield url


@pytest.fixture(scope="module")
def harness(redis_url: str, default_model_dir: Path) -> Iterator[Harness]:
    stubs = [StubWorker("p1", "prefill"), StubWorker("d1", "decode")]
    with Harness(redis_url, default_model_dir, stubs, {"api_key": KEYS}) as h:
        yield h


def _body(**fields: Any) -> bytes:
    return json.dumps({"model": MODEL, "prompt": [1, 2, 3], **fields}).encode()


def _chat(**fields: Any) -> bytes:
    return json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                       **fields}).encode()  # fmt: skip


BAD_INPUT: list[tuple[str, bytes, int, str | None, str | None]] = [
    # (path, body, status, param, code)
    ("/v1/completions", b"", 400, None, None),
    ("/v1/completions", b"{", 400, None, None),
    ("/v1/completions", b"\xff\xfe{}", 400, None, None),
    ("/v1/completions", b"[1, 2]", 400, None, None),
    ("/v1/completions", b'{"model": 5, "prompt": "hi"}', 400, "model", "invalid_type"),
    ("/v1/completions", _body(prompt={"a": 1}), 400, "prompt", "invalid_type"),
    ("/v1/completions", _body(prompt=[1] * 2100), 400, "prompt", "context_length_exceeded"),
    ("/v1/completions", _body(prompt=[1, 49152]), 400, "prompt", "invalid_value"),
    ("/v1/completions", _body(max_tokens=0), 400, "max_tokens", "invalid_value"),
    ("/v1/completions", _body(max_tokens=-5), 400, "max_tokens", "invalid_value"),
    ("/v1/completions", _body(max_tokens=5000), 400, "prompt", "context_length_exceeded"),
    ("/v1/completions", _body(max_tokens=1 << 32), 400, "max_tokens", "invalid_value"),
    ("/v1/completions", _body(max_tokens="5"), 400, "max_tokens", "invalid_type"),
    ("/v1/completions", _body(n=17), 400, "n", "invalid_value"),
    ("/v1/completions", _body(n=0), 400, "n", "invalid_value"),
    ("/v1/completions", _body(top_k=1 << 32), 400, "top_k", "invalid_value"),
    ("/v1/completions", _body(temperature="hot"), 400, "temperature", "invalid_type"),
    ("/v1/completions", _body(cache_salt="s" * 257), 400, "cache_salt", "invalid_value"),
    ("/v1/completions", _body(model="other"), 404, "model", "model_not_found"),
    ("/v1/chat/completions", _chat(messages="hi"), 400, "messages", "invalid_type"),
    ("/v1/chat/completions", _chat(messages=[]), 400, "messages", "invalid_value"),
    ("/v1/chat/completions", _chat(max_completion_tokens=0), 400, "max_completion_tokens",
     "invalid_value"),
    ("/v1/chat/completions", _chat(max_tokens=4000), 400, "messages", "context_length_exceeded"),
    ("/v1/chat/completions", _chat(n=99), 400, "n", "invalid_value"),
    ("/v1/chat/completions", _chat(model="other"), 404, "model", "model_not_found"),
    ("/v1/chat/completions", b'{"model": "%s"' % MODEL.encode() + b" " * (2 << 20) + b"}", 413,
     None, "request_too_large"),
]  # fmt: skip


def test_bad_input_is_refused_before_any_worker_call(harness: Harness) -> None:
    before = {s.worker_id: s.work_calls() for s in harness.stubs.values()}
    for path, body, status, param, code in BAD_INPUT:
        got, raw = harness.get(path, body)
        assert got == status, (path, body[:80], raw)
        err = json.loads(raw)["error"]
        assert err["type"] == "invalid_request_error", raw
        assert (err["param"], err["code"]) == (param, code) or code is None, (body[:80], err)
    status, body = harness.get("/v1/completions")  # GET on a POST route
    assert status == 405 and json.loads(body)["error"]["message"] == "Method Not Allowed"
    assert {s.worker_id: s.work_calls() for s in harness.stubs.values()} == before


def test_chunked_body_over_the_limit_is_refused(harness: Harness) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", harness.port, timeout=10)
    try:
        parts = (b"x" * (64 << 10) for _ in range(20))  # 1.25 MiB, no Content-Length
        headers = {"Content-Type": "application/json", "Authorization": "Bearer sk-shared"}
        conn.request("POST", "/v1/completions", body=parts, encode_chunked=True, headers=headers)
        resp = conn.getresponse()
        assert resp.status == 413
        assert json.loads(resp.read())["error"]["code"] == "request_too_large"
    finally:
        conn.close()


def test_every_route_but_health_needs_a_key(harness: Harness) -> None:
    assert harness.get("/health", headers={})[0] == 200
    failures = _auth_failures(harness)
    default_id = harness.config.resolved_router_id()  # no --router-id: <hostname>:<port>
    assert default_id.endswith(f":{harness.port}")
    for path in GUARDED:
        for headers in ({}, {"Authorization": "Bearer sk-wrong"}, {"Authorization": "sk-bob"}):
            status, got, body = harness.request(path, headers=headers)
            assert status == 401, (path, headers)
            assert got["www-authenticate"] == "Bearer"
            assert got["x-kvserve-router"] == default_id  # refusals name the router too
            assert json.loads(body) == unauthorized().body()
            assert b"sk-" not in body
    for path in GUARDED[:-1]:
        assert harness.get(path, headers={"Authorization": "Bearer sk-bob"})[0] == 200, path
    big = b'{"model": "' + b"x" * (2 << 20) + b'"}'  # refused for the key, not for its size
    assert harness.get("/v1/completions", big, headers={})[0] == 401
    assert _auth_failures(harness) == failures + 3 * len(GUARDED) + 1


def _auth_failures(harness: Harness) -> float:
    for line in harness.get("/metrics")[1].decode().splitlines():
        if line.startswith("kvserve:auth_failures_total "):
            return float(line.split()[1])
    raise AssertionError("no kvserve:auth_failures_total")


def test_official_client_with_and_without_a_key(harness: Harness) -> None:
    with pytest.raises(openai.AuthenticationError) as denied:
        harness.client("sk-nope").completions.create(model=MODEL, prompt="hi", max_tokens=2)
    assert denied.value.code == "invalid_api_key"
    out = harness.client("sk-alice").completions.create(model=MODEL, prompt=[1, 2], max_tokens=2)
    assert out.choices[0].text == " t2 t3"


def test_a_disaggregated_answer_returns_its_token_ids(harness: Harness) -> None:
    """The first id from the prefill worker, the rest from the decode worker (vLLM's
    ``return_token_ids``, read through the official client)."""
    prompt, client = [10, 20, 30, 40, 50, 60], harness.client()
    asked: dict[str, Any] = {"model": MODEL, "prompt": prompt, "max_tokens": 5}
    expected = [out_token(prompt, i) for i in range(5)]
    out = client.completions.create(extra_body={"return_token_ids": True}, **asked)
    assert out.id == "cmpl-" + harness.stubs["p1"].called("Prefill")[-1]  # disaggregated
    assert out.choices[0].model_extra == {"token_ids": expected, "prompt_token_ids": prompt}
    stream = client.completions.create(stream=True, extra_body={"return_token_ids": True}, **asked)
    streamed = [c.choices[0].model_extra or {} for c in stream]
    assert [t for c in streamed for t in c["token_ids"]] == expected
    assert not client.completions.create(**asked).choices[0].model_extra  # not asked for


def test_openapi_declares_bearer_security(harness: Harness) -> None:
    doc = json.loads(harness.get("/openapi.json")[1])
    assert doc["components"]["securitySchemes"] == {"apiKey": {"type": "http", "scheme": "bearer"}}
    assert doc["paths"]["/health"]["get"]["security"] == []
    completions = doc["paths"]["/v1/completions"]["post"]
    assert completions["security"] == [{"apiKey": []}]
    assert "401" in completions["responses"] and "429" in completions["responses"]


def test_tenants_salt_their_requests(harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    assert harness.app is not None
    planner = harness.app.state.service.planner
    salts: list[str] = []
    plan = planner.plan

    async def spy(admitted: Any) -> Any:
        salts.append(admitted.cache_salt)
        return await plan(admitted)

    monkeypatch.setattr(planner, "plan", spy)
    calls: list[tuple[str, dict[str, Any]]] = [
        ("sk-alice", {}), ("sk-alice", {"cache_salt": "x"}), ("sk-shared", {}),
        ("sk-shared", {"cache_salt": "x"}), ("sk-bob", {"cache_salt": ""}),
    ]  # fmt: skip
    for key, extra in calls:
        harness.client(key).completions.create(
            model=MODEL, prompt=[3, 4], max_tokens=1, extra_body=extra
        )
    messages: Any = [{"role": "user", "content": "hi"}]
    harness.client("sk-bob").chat.completions.create(
        model=MODEL, messages=messages, max_tokens=1, extra_body={"cache_salt": "y"}
    )
    shared = bare_key_tenant(hashlib.sha256(b"sk-shared").digest())  # a bare key: its own
    assert salts == ["alice\x00", "alice\x00x", f"{shared}\x00", f"{shared}\x00x", "bob\x00",
                     "bob\x00y"]  # fmt: skip


def test_admission_refuses_a_late_first_token_with_retry_after(
    redis_url: str, default_model_dir: Path
) -> None:
    load = {"queued_prefill_tokens": "500", "prefill_tokens_per_s": 100.0}
    # a decode stub this slow never takes the long prompts itself (prefill_locally)
    slow = {"prefill_tokens_per_s": 10.0}
    stubs = [StubWorker("p1", "prefill", load=load), StubWorker("d1", "decode", load=slow)]
    # no beat within the test: a new report drops the router's pending count of the first
    # request (router.placement.pending), which the second one's prediction includes
    options = {"admission_ttft_s": 10.0}
    with Harness(redis_url, default_model_dir, stubs, options, heartbeat_s=300.0) as h:
        _admission(h)


def _admission(harness: Harness) -> None:
    p1 = harness.stubs["p1"]
    client = harness.client()
    out = client.completions.create(model=MODEL, prompt=[5] * 300, max_tokens=2)  # 8 s: in
    assert out.choices[0].text == " t6 t6" and len(p1.called("Prefill")) == 1
    with pytest.raises(openai.RateLimitError) as busy:  # (500 + 300 pending + 600) / 100
        client.completions.create(model=MODEL, prompt=[6] * 600, max_tokens=2)
    assert busy.value.status_code == 429 and busy.value.code == "rate_limit_exceeded"
    assert busy.value.response.headers["retry-after"] == "4"
    assert busy.value.body == {
        "message": "The server is overloaded: this request's first token is predicted in "
        "14.0 s, over the 10 s limit. Retry after 4 s.",
        "type": "rate_limit_error", "param": None, "code": "rate_limit_exceeded",
    }  # fmt: skip
    assert len(p1.called("Prefill")) == 1 and not p1.called("Reserve")
    out = client.completions.create(model=MODEL, prompt=[7, 8], max_tokens=1)  # local: in
    assert out.choices[0].text == " t8"
    metrics = harness.get("/metrics")[1].decode()
    assert 'kvserve:admission_rejections_total{worker="p1"} 1.0' in metrics
    assert 'kvserve:requests_total{status="rejected"} 1.0' in metrics
