"""Which router answered, through real HTTP (a real Redis and a stub decode worker: see
:mod:`tests.integration.router_harness`): the ``X-Kvserve-Router`` header on every response
(routes, errors, streams), ``"router"`` in ``/v1/cache/stats``, ``kvserve:router_info`` in
``/metrics``, and the controller's lease in ``/v1/controller`` of a router without
``--controller`` (it holds nothing)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families as parse

from router.api.app import ROUTER_HEADER
from tests.integration.router_harness import (
    MODEL,
    Harness,
    StubWorker,
    running_redis,
    wait_for,
)

ROUTER_ID = "router-7"


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory, default_model_dir: Path) -> Iterator[Harness]:
    with running_redis(tmp_path_factory.mktemp("redis")) as url:
        stubs = [StubWorker("d1", "decode")]
        with Harness(url, default_model_dir, stubs, {"router_id": ROUTER_ID}) as h:
            assert wait_for(lambda: h.get("/health")[0] == 200, timeout=60)  # tokenizer loaded
            yield h


def test_every_response_names_the_router(harness: Harness) -> None:
    completion = json.dumps({"model": MODEL, "prompt": [1, 2, 3], "max_tokens": 2}).encode()
    streamed = json.dumps({"model": MODEL, "prompt": [4, 5], "max_tokens": 2, "stream": True})
    for path, body, status in [
        ("/health", None, 200),
        ("/v1/models", None, 200),
        ("/", None, 200),
        ("/nowhere", None, 404),
        ("/v1/completions", b"{", 400),
        ("/v1/completions", completion, 200),
        ("/v1/completions", streamed.encode(), 200),
    ]:
        got, headers, _ = harness.request(path, body)
        assert got == status, path
        # (lowercased by the harness's uvicorn parser, httptools; `kvserve router` uses h11,
        # which sends the name as ROUTER_HEADER spells it)
        assert headers.get(ROUTER_HEADER.lower()) == ROUTER_ID, (path, list(headers))


def test_cache_stats_and_metrics_name_the_router(harness: Harness) -> None:
    status, body = harness.get("/v1/cache/stats")
    stats = json.loads(body)
    assert status == 200 and stats["router"] == ROUTER_ID
    assert {"last_minute", "since_start", "pool_lookup"} <= stats.keys()
    status, body = harness.get("/metrics")
    samples = {s.name: s for f in parse(body.decode()) for s in f.samples}
    info = samples["kvserve:router_info"]
    assert (info.labels, info.value) == ({"router": ROUTER_ID}, 1.0)
    assert samples["kvserve:controller_leader"].value == 0.0


def test_a_router_without_controller_holds_no_lease(harness: Harness) -> None:
    status, body = harness.get("/v1/controller")
    report = json.loads(body)
    assert status == 200 and not report["enabled"]
    assert report["lease"] == {"holder": None, "held_here": False}
