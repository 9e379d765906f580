"""Schemathesis fuzzing of the router's whole HTTP API, from its own OpenAPI document.

The router runs with an API key and stub workers (:mod:`tests.integration.router_harness`);
every operation of ``/openapi.json`` gets schema-valid and schema-invalid requests. Checked:
no 5xx, every status, content type, header and error body as documented, invalid bodies
refused with a 4xx, and the key enforced where the document says so. Not checked:
``positive_data_acceptance`` (a schema-valid request may still be refused by design: another
model's name, ``n`` > 1, a prompt over the context length). Valid bodies name the served
model, so that they reach tokenization, placement and the stub workers (whose 256-token
context keeps the answers short).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import checks

from kvpool.config import PoolConfig
from proto.registry import ClusterConfig
from router.api.app import create_app
from router.config import RouterConfig
from tests.integration.router_harness import MODEL, Harness, StubWorker, running_redis

KEY = "sk-fuzz"
AUTH = {"Authorization": f"Bearer {KEY}"}
CHECKS = [
    checks.not_a_server_error,
    checks.status_code_conformance,
    checks.content_type_conformance,
    checks.response_headers_conformance,
    checks.response_schema_conformance,
    checks.negative_data_rejection,
    checks.ignored_auth,
]


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory, default_model_dir: Path) -> Iterator[Harness]:
    stubs = [StubWorker("p1", "prefill"), StubWorker("d1", "decode")]
    with (
        running_redis(tmp_path_factory.mktemp("redis")) as url,
        Harness(url, default_model_dir, stubs, {"api_key": KEY}, max_model_len=256) as h,
    ):
        yield h


def document() -> dict[str, Any]:
    """The OpenAPI document of a router with an API key (built without serving)."""
    cluster = ClusterConfig(redis_url="redis://127.0.0.1:1", cluster="fuzz-doc")
    app = create_app(RouterConfig(api_key=KEY, pool_lookup=False), cluster, PoolConfig())
    return app.openapi()


# Built at collection time: schemathesis's fixture-based (lazy) schemas need pytest < 9.
schema = schemathesis.openapi.from_dict(document())


def test_the_served_document_is_the_fuzzed_one(harness: Harness) -> None:
    status, body = harness.get("/openapi.json")
    assert status == 200 and json.loads(body) == document()


@schema.parametrize()
@settings(max_examples=50, deadline=None, suppress_health_check=list(HealthCheck))
def test_api_conforms_to_its_document(case: schemathesis.Case[Any], harness: Harness) -> None:
    body = case.body
    if isinstance(body, dict) and isinstance(body.get("model"), str):
        body["model"] = MODEL
    case.call_and_validate(
        base_url=f"http://127.0.0.1:{harness.port}", headers=AUTH, checks=CHECKS, timeout=30
    )
