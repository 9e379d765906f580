"""Every panel of the shipped Grafana dashboard shows data from a live cluster, through a
real Prometheus (Debian's ``prometheus``; scripts/setup.sh installs it, and without it
this test fails, never skips).

The cluster is the one ``kvserve up`` runs (:class:`kvserve.cluster.launch.Cluster`):
Redis, mooncake_master, the router with API keys and the P:D controller on, and 3 decode
workers on the tiny model, each serving its own ``/metrics``. Prometheus scrapes the
router with a key of its own (the router refuses an unauthenticated scrape), the workers
in one job and the master. Traffic: closed-loop senders until the controller moves a
decode worker to prefill (its series then say ``role="prefill"``, whatever the job), then
a stream whose decode worker freezes mid-way, so it migrates, and a few requests more (the
controller's SLO window starts over after a move). Then every target of every panel is
queried through Prometheus's HTTP API and must return a finite value; and the router's
status page, opened in headless Chromium with the client's key, shows the three workers
(one of them now a prefill worker) and the controller's completed move (its screenshot is
the README's: :func:`tests.browser.screenshot`).
"""

from __future__ import annotations

import math
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import openai
import pytest

from kvserve.cluster import faults
from kvserve.cluster.launch import Cluster
from tests.browser import chromium_page, screenshot, sign_in
from tests.dashboard import queries
from tests.midstream import fault_mid_stream
from tests.prometheus import Prometheus, prometheus_binary
from tests.tiny_cluster import (
    FAST_FAULT_ROUTER,
    FAST_FAULT_WORKER,
    MODEL_NAME,
    prompt_of,
    tiny_cluster_spec,
)

CLIENT_KEY, SCRAPE_KEY = "sk-test-client-0123456789", "sk-test-scrape-0123456789"
CONTROLLER = (
    "--controller", "--controller-interval-s", "0.5", "--controller-window-s", "30",
    "--controller-ttft-slo-s", "1e-6", "--controller-tpot-slo-s", "1000",
    "--controller-min-samples", "2", "--controller-patience", "1",
    "--controller-cooldown-s", "1", "--controller-min-prefill", "0",
    "--controller-min-decode", "2",
)  # fmt: skip
"""A TTFT SLO nobody meets: one decode worker moves to prefill, and no more (2 stay)."""
WINDOW = "5m"  # $__rate_interval in the checked queries: the whole test's traffic


def scrape_config(cluster: Cluster, key_file: Path) -> dict[str, Any]:
    """Prometheus's configuration for ``cluster``: the router with a bearer key, every
    worker in one job (no role by job: the role is a label of the workers' series), and
    the pool master."""
    router = cluster.router_url.removeprefix("http://")
    workers = [f"{p.host}:{p.metrics_port}" for p in cluster.plan.workers]
    assert cluster.master is not None
    master = f"127.0.0.1:{cluster.master.master_metrics_port}"
    return {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {
                "job_name": "router",
                "authorization": {"type": "Bearer", "credentials_file": str(key_file)},
                "static_configs": [{"targets": [router]}],
            },
            {"job_name": "workers", "static_configs": [{"targets": workers}]},
            {"job_name": "pool", "static_configs": [{"targets": [master]}]},
        ],
    }


def senders(client: openai.OpenAI, stop: threading.Event, errors: list[BaseException]) -> None:
    """Short greedy completions one after another, each prompt sent twice (the second
    finds its prefix cached) until ``stop``."""
    i = 0
    while not stop.is_set():
        prompt = prompt_of(40 + i % 7, 500 + i // 2)
        try:
            client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=4)
        except Exception as exc:  # the test reports every failure
            errors.append(exc)
        i += 1


def finite(result: list[dict[str, Any]]) -> list[float]:
    return [v for s in result if math.isfinite(v := float(s["value"][1]))]


def test_every_dashboard_query_returns_data(tiny_model_dir: Path, tmp_path: Path) -> None:
    prometheus_binary()  # fails here, before the cluster, when the package is missing
    spec = tiny_cluster_spec(
        tiny_model_dir,
        tmp_path / "logs",
        prefill=0,
        decode=3,
        api_key=f"client={CLIENT_KEY},prometheus={SCRAPE_KEY}",
        worker_metrics_base_port=9100,  # replaced by free ports, like every other one
        router_args=(*CONTROLLER, *FAST_FAULT_ROUTER),
        worker_args=FAST_FAULT_WORKER,
    )
    key_file = tmp_path / "router_key"
    key_file.write_text(SCRAPE_KEY)
    (tmp_path / "prometheus").mkdir()
    with Cluster(spec).start() as cluster:
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(cluster.router_url + "/metrics", timeout=10)
        assert refused.value.code == 401  # keys on: an unauthenticated scrape is refused
        client = openai.OpenAI(
            base_url=cluster.router_url + "/v1", api_key=CLIENT_KEY, max_retries=0, timeout=120
        )
        config = scrape_config(cluster, key_file)
        with Prometheus(config, tmp_path / "prometheus") as prom:
            stop, errors = threading.Event(), list[BaseException]()
            threads = [
                threading.Thread(target=senders, args=(client, stop, errors)) for _ in range(2)
            ]
            for thread in threads:
                thread.start()
            try:
                moved = prom.wait_for('kvserve:role_changes_total{result="completed"} > 0', 120)
            finally:
                stop.set()
                for thread in threads:
                    thread.join(60)
            assert not errors, errors[:3]
            assert moved[0]["metric"]["to_role"] == "prefill"
            prom.wait_for('kvserve:workers{role="prefill"} == 1', 30)
            worker = prom.wait_for('vllm:num_requests_running{role="prefill"}', 30)
            assert len(worker) == 1 and worker[0]["metric"]["job"] == "workers"
            assert worker[0]["metric"]["worker"].startswith("decode-")  # a moved decode worker

            _, frozen = fault_mid_stream(
                client, cluster, prompt_of(40, 7), lambda name: faults.freeze(cluster, name)
            )
            faults.thaw(cluster, frozen)
            assert faults.wait_routable(cluster)
            for i in range(30):  # the controller's window, emptied by the move, fills again
                client.completions.create(
                    model=MODEL_NAME, prompt=prompt_of(30, 900 + i), max_tokens=4
                )
                if prom.query("kvserve:slo_attainment >= 0"):  # NaN compares false
                    break
                time.sleep(0.5)
            prom.wait_for("kvserve:migrations_total > 0", 30)
            prom.wait_for('up{job="router"} == 1', 10)
            prom.wait_for("count(up == 1) == 5", 30)  # router, 3 workers, master
            empty = [
                (q.panel, q.ref, q.at(WINDOW))
                for q in queries()
                if not finite(prom.query(q.at(WINDOW)))
            ]
            assert not empty, f"panels without data: {empty}"
        check_status_page(cluster, worker[0]["metric"]["worker"], tmp_path)


MOVED = """(worker) => [...document.querySelectorAll('#decisions tbody tr')].some(
    (r) => r.cells.length === 5 && r.cells[1].textContent === worker
        && r.cells[4].textContent === 'completed')"""
"""Script: the decisions table shows ``worker``'s move as completed."""


def check_status_page(cluster: Cluster, moved: str, folder: Path) -> None:
    """The status page with the client's key: 3 workers, ``moved`` among them as a prefill
    worker, and its move in the controller's decisions ("decode → prefill", completed)."""
    with chromium_page() as browsed:
        page = browsed.page
        page.goto(cluster.router_url + "/")
        sign_in(page, CLIENT_KEY)
        page.wait_for_function(MOVED, arg=moved, timeout=30_000)
        assert page.text_content("#worker-count") == "(3)"
        rows = page.locator("#workers tbody tr")
        roles = dict(
            zip(
                [t.strip() for t in rows.locator("td:first-child").all_text_contents()],
                rows.evaluate_all("rows => rows.map(r => r.dataset.role)"),
                strict=True,
            )
        )
        assert roles[moved] == "prefill" and sorted(roles.values()).count("decode") == 2
        assert page.text_content("#controller-state") == "on"
        move = page.locator("#decisions tbody tr", has_text=moved).first.locator("td")
        assert move.nth(2).text_content() == "decode → prefill"
        assert browsed.errors == []
        screenshot(page, folder, docs=True)
