"""``GET /v1/status`` and the status page of a router with API keys and stub workers
(:mod:`tests.integration.router_harness`), in headless Chromium (:mod:`tests.browser`).

- the JSON answer: its schema (:class:`router.api.status.StatusReport`), the workers with
  their roles and load, the counters after a few requests; 401 without a key;
- the page's files: public, with their content types and a Content-Security-Policy;
- in the browser: the page asks for a key, refuses a wrong one, shows the workers with
  the right one and keeps it for the tab; a worker id that looks like HTML is shown as
  text. The end-to-end test on a real cluster is ``tests/e2e/test_status_page.py``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from router.api.auth import STATUS_PAGE
from router.api.routes.page import HEADERS
from router.api.status import StatusReport
from tests.browser import chromium_page
from tests.integration.router_harness import MODEL, Harness, StubWorker, running_redis

KEY = "sk-status-0123456789"
ODD_ID = "<i>p2"
"""A worker id the registry accepts (printable ASCII, no space, ':' or '/') that is HTML."""


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory, default_model_dir: Path) -> Iterator[Harness]:
    stubs = [
        StubWorker("p1", "prefill"),
        StubWorker(ODD_ID, "prefill", 50, load={"running": 1, "waiting": 2}),
        StubWorker("d1", "decode", 150, load={"requests": "7", "decode_tokens_per_s": 12.5}),
    ]
    with (
        running_redis(tmp_path_factory.mktemp("redis")) as url,
        Harness(url, default_model_dir, stubs, {"api_key": KEY}) as h,
    ):
        client = h.client()
        for i in range(3):
            client.completions.create(model=MODEL, prompt=[5 + i] * 12, max_tokens=4)
        yield h


def status(harness: Harness) -> StatusReport:
    code, body = harness.get("/v1/status")
    assert code == 200, body
    return StatusReport.model_validate_json(body)


def test_status_reports_workers_cache_latency_and_controller(harness: Harness) -> None:
    report = status(harness)
    assert report.model == MODEL and report.serving
    workers = {w.worker_id: w for w in report.workers}
    assert [w.worker_id for w in report.workers] == sorted(workers)
    assert {i: w.role for i, w in workers.items()} == {
        "p1": "prefill",
        ODD_ID: "prefill",
        "d1": "decode",
    }
    assert {w.state for w in report.workers} == {"active"}
    odd, d1 = workers[ODD_ID], workers["d1"]
    assert (odd.running, odd.waiting, odd.kv_pages_used, odd.kv_pages_total) == (1, 2, 150, 200)
    assert odd.kv_use == pytest.approx(0.75)
    assert (d1.requests, d1.decode_tokens_per_s) == (7, 12.5)
    assert report.requests["ok"] == 3
    for window in (report.cache.last_minute, report.cache.since_start):
        assert window.requests == 3 and window.prompt_tokens == 36
        assert window.token_rates.pool == pytest.approx(5 / 12)  # the stubs' usage
    prefilled = [w for w in report.workers if w.hit_rates.pool is not None]
    assert prefilled and all(w.role == "prefill" for w in prefilled)
    assert report.latency.ttft.count == 3 and report.latency.itl.count == 9
    assert report.latency.ttft.p50_s is not None and report.latency.ttft.p50_s >= 0
    assert not report.controller.enabled and report.controller.decisions == []
    assert report.controller.verdict == "ok"


def test_status_needs_a_key_and_the_page_files_do_not(harness: Harness) -> None:
    code, _ = harness.get("/v1/status", headers={})
    assert code == 401
    for path, name in STATUS_PAGE.items():
        code, headers, body = harness.request(path, headers={})
        assert code == 200, path
        assert headers["content-type"].startswith(
            {"html": "text/html", "js": "text/javascript", "css": "text/css"}[name.split(".")[1]]
        )
        assert headers["content-security-policy"] == HEADERS["Content-Security-Policy"]
        assert KEY.encode() not in body


def test_openapi_documents_the_status_and_not_the_page(harness: Harness) -> None:
    code, body = harness.get("/openapi.json")
    assert code == 200
    doc = json.loads(body)
    operation = doc["paths"]["/v1/status"]["get"]
    assert operation["security"] == [{"apiKey": []}]
    schema = operation["responses"]["200"]["content"]["application/json"]["schema"]
    assert schema == {"$ref": "#/components/schemas/StatusReport"}
    assert not set(STATUS_PAGE) & set(doc["paths"])


def test_the_page_asks_for_a_key_then_shows_the_workers(harness: Harness) -> None:
    with chromium_page() as browsed:
        page = browsed.page
        page.goto(f"http://127.0.0.1:{harness.port}/")
        page.wait_for_selector("#key-form:not([hidden])")
        assert page.is_hidden("#status")
        page.fill("#key", "sk-wrong")
        page.click("#key-form button")
        page.wait_for_function("() => document.getElementById('key-error').textContent !== ''")
        assert page.text_content("#key-error") == "That key was refused."
        page.fill("#key", KEY)
        page.click("#key-form button")
        rows = page.locator("#workers tbody tr")
        rows.nth(2).wait_for()
        assert page.is_hidden("#key-form")
        assert rows.evaluate_all("rows => rows.map(r => r.dataset.role)") == [
            "prefill", "decode", "prefill"
        ]  # fmt: skip
        assert rows.first.locator("td").first.text_content() == ODD_ID  # as text
        assert page.locator("#workers i").count() == 0  # not as HTML
        assert page.evaluate("sessionStorage.getItem('kvserve-api-key')") == KEY
        page.reload()  # the key stays with the tab
        rows.nth(2).wait_for()
        assert page.is_hidden("#key-form")
        assert page.text_content("#controller-state") == "off"
        assert browsed.errors == []
