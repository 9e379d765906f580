"""The router's status page on a live cluster, in headless Chromium (:mod:`tests.browser`:
Debian's ``chromium``; without it this test fails, never skips).

The cluster is the package's shared one (``conftest.py``: a prefill and a decode worker on
the tiny model, every request disaggregated, no API keys, no controller). Traffic through
the official ``openai`` client: prompts sent twice (the second finds its prefix in the
prefill worker's cache) and a streamed completion. The page must show both workers with
their roles, the figures of ``GET /v1/status`` (hit rates, request counts, TTFT / ITL)
and the controller's section, then a request more on its next refresh. A screenshot goes
to the test's folder. The page with API keys and the controller's decisions, on a cluster
whose controller moves a worker, is checked in ``test_dashboard.py`` (which takes the
README's screenshot).
"""

from __future__ import annotations

from pathlib import Path

from playwright.sync_api import Locator

from kvserve.cluster.launch import Cluster
from tests.browser import chromium_page, screenshot
from tests.tiny_cluster import MODEL_NAME, cluster_client, prompt_of, router_status

SHOWN_REQUESTS = (
    "Number((document.querySelector('#requests tr.total td')?.textContent ?? '0')"
    ".replace(/,/g, ''))"
)
"""Script: the requests since the start that the page shows (a count that only grows; the
TTFT samples of the last minute may shrink as older ones leave the window)."""
LIVE = f"""([workers, above]) => document.querySelectorAll('#workers tbody tr').length === workers
    && {SHOWN_REQUESTS} > above"""
"""Script: the page lists ``workers`` workers and shows more than ``above`` requests."""


def texts(where: Locator) -> list[str]:
    """The text of every element ``where`` finds, stripped."""
    return [text.strip() for text in where.all_text_contents()]


def test_status_page_shows_the_live_cluster(eval_cluster: Cluster, tmp_path: Path) -> None:
    client = cluster_client(eval_cluster)
    for i in range(4):  # each prompt twice
        client.completions.create(
            model=MODEL_NAME, prompt=prompt_of(48, 8100 + i // 2), max_tokens=4
        )
    stream = client.completions.create(
        model=MODEL_NAME, prompt=prompt_of(40, 8200), max_tokens=8, stream=True
    )
    assert len(list(stream)) >= 2
    report = router_status(eval_cluster)
    assert sorted(w.role for w in report.workers) == ["decode", "prefill"]
    assert report.requests["ok"] >= 5 and report.latency.ttft.count >= 5
    assert report.latency.itl.count > 0 and report.cache.since_start.token_rates.local

    with chromium_page() as browsed:
        page = browsed.page
        page.goto(eval_cluster.router_url + "/")
        page.wait_for_function(LIVE, arg=[2, 0], timeout=30_000)
        assert page.is_hidden("#key-form")  # no keys on this router
        assert page.text_content("#model") == MODEL_NAME
        assert page.text_content("#health") == "serving"
        assert page.text_content("#worker-count") == "(2)"
        rows = page.locator("#workers tbody tr")
        roles = rows.evaluate_all("rows => rows.map(r => r.dataset.role)")
        assert sorted(roles) == ["decode", "prefill"]
        ids = texts(rows.locator("td:first-child"))
        assert sorted(ids) == sorted(w.worker_id for w in report.workers)

        since_start = texts(page.locator("#cache tbody tr").nth(1).locator("td"))
        assert since_start[0] == f"{report.cache.since_start.requests:,}"  # no traffic since
        local = report.cache.since_start.token_rates.local
        assert abs(float(since_start[2].removesuffix(" %")) - 100 * local) <= 0.051
        requests = dict(
            zip(
                texts(page.locator("#requests tbody th")),
                texts(page.locator("#requests tbody td")),
                strict=True,
            )
        )
        assert requests["ok"] == f"{report.requests['ok']:,}"
        ttft = texts(page.locator("#latency tbody tr").first.locator("td"))
        assert int(ttft[0].replace(",", "")) >= 5 and ttft[2].endswith(("ms", " s"))

        assert page.text_content("#controller-state") == "off"
        assert "no decisions yet" in (page.text_content("#decisions") or "")
        facts = texts(page.locator("#controller-summary dd"))
        assert facts[0] == report.controller.verdict

        shown = int(page.evaluate(SHOWN_REQUESTS))
        assert shown >= report.requests["ok"]
        client.completions.create(model=MODEL_NAME, prompt=prompt_of(48, 8300), max_tokens=4)
        page.wait_for_function(LIVE, arg=[2, shown], timeout=30_000)  # the next refresh
        assert browsed.errors == []
        screenshot(page, tmp_path)
