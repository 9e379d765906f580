"""The P:D ratio controller against real processes: Redis, mooncake_master, the router
(``--controller``) and 2 decode workers on the tiny model, driven by the official client.

With a TTFT SLO nobody meets and a TPOT SLO everybody meets, the controller moves one
decode worker to prefill (and no further: ``min_decode`` 1). The worker drains and
switches (``GetLoad`` and the registry say prefill), the change is in ``/v1/controller``
and ``/metrics``, later requests are prefilled on it, and every request sent before,
during and after the move succeeds.
"""

from __future__ import annotations

import json
import threading
import urllib.request
from pathlib import Path
from typing import Any

import openai

from kvserve.cluster.faults import load_of, router_metric
from kvserve.cluster.launch import Cluster
from proto.registry import connect, list_workers
from tests.integration.router_harness import wait_for
from tests.tiny_cluster import MODEL_NAME, cluster_client, prompt_of, tiny_cluster_spec

CONTROLLER_ARGS = (
    "--controller", "--controller-interval-s", "0.5", "--controller-window-s", "30",
    "--controller-ttft-slo-s", "1e-6", "--controller-tpot-slo-s", "1000",
    "--controller-min-samples", "2", "--controller-patience", "1",
    "--controller-cooldown-s", "1", "--controller-min-prefill", "0",
)  # fmt: skip
SENDERS = 3


def controller_report(cluster: Cluster) -> dict[str, Any]:
    with urllib.request.urlopen(cluster.router_url + "/v1/controller", timeout=10) as r:
        report: dict[str, Any] = json.load(r)
    return report


def moved(cluster: Cluster) -> bool:
    history = controller_report(cluster)["history"]
    return bool(history) and history[0]["result"] is not None


def prefilled_on(cluster: Cluster, worker: str) -> float:
    ttft = "vllm:time_to_first_token_seconds_count"
    return router_metric(cluster, ttft, mode="disagg", worker=worker)


class Load:
    """Closed-loop senders: each sends one short greedy completion after another."""

    def __init__(self, client: openai.OpenAI) -> None:
        self.client = client
        self.done: list[str] = []
        self.errors: list[BaseException] = []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._send, args=(s,)) for s in range(SENDERS)]

    def _send(self, seed: int) -> None:
        i = 0
        while not self.stop.is_set():
            prompt = prompt_of(24 + i % 9, seed * 1000 + i)
            try:
                out = self.client.completions.create(
                    model=MODEL_NAME, prompt=prompt, max_tokens=4, temperature=0
                )
                self.done.append(out.choices[0].finish_reason)
            except Exception as exc:  # every failure is a lost request: the test reports it
                self.errors.append(exc)
            i += 1

    def __enter__(self) -> Load:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(60)


def test_controller_moves_a_decode_worker_to_prefill_and_loses_no_request(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    spec = tiny_cluster_spec(
        tiny_model_dir, tmp_path, prefill=0, decode=2, router_args=CONTROLLER_ARGS
    )
    with Cluster(spec).start() as cluster:
        client = cluster_client(cluster, timeout=60)
        with Load(client) as load:
            assert wait_for(lambda: moved(cluster), timeout=90), controller_report(cluster)
            after_move = len(load.done)
            worker = controller_report(cluster)["history"][0]["worker_id"]
            # the router sends prompts to the new prefill worker once the registry shows it
            assert wait_for(lambda: prefilled_on(cluster, worker) > 0, timeout=30)
            assert wait_for(lambda: len(load.done) >= after_move + 2 * SENDERS, timeout=60)
        assert not load.errors, load.errors[:3]
        assert len(load.done) > after_move > 0

        report = controller_report(cluster)
        assert report["enabled"] and report["config"]["patience"] == 1
        (change,) = report["history"]  # min_decode 1: one move, no more
        assert (change["from_role"], change["to_role"], change["result"]) == (
            "decode", "prefill", "completed"
        )  # fmt: skip
        assert "ttft" in change["reason"].lower() and change["completed_at"] >= change["at_s"]
        assert change["worker_id"] == worker
        report_of = load_of(cluster, worker, timeout=10)
        assert report_of.role == "prefill" and not report_of.draining
        records = list_workers(connect(spec.cluster_config), spec.cluster_config.keys)
        assert {r.worker_id: r.role for r in records}[worker] == "prefill"

        changes = router_metric(cluster, "kvserve:role_changes_total", from_role="decode",
                         to_role="prefill", result="completed")  # fmt: skip
        assert changes == 1
        assert router_metric(cluster, "kvserve:workers", role="prefill") == 1
        assert router_metric(cluster, "kvserve:workers", role="decode") == 1
        assert router_metric(cluster, "kvserve:slo_attainment", metric="tpot") == 1.0
