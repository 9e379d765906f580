"""The pure parts of ``GET /v1/status``: the live latency windows on a fake clock, the
telemetry that feeds them, and the controller's part built from its real report."""

from __future__ import annotations

import math

import pytest

from proto import worker_pb2 as pb
from proto.registry import ClusterConfig
from router.api.status import DECISIONS, controller_status
from router.config import RouterConfig
from router.control.controller import RoleController
from router.control.lease import ControllerLease
from router.control.ratio import RoleChange
from router.observability.cache_stats import CacheStats
from router.observability.latency_window import (
    LatencySummary,
    LatencyWindow,
    LiveLatency,
    summarize,
)
from router.observability.metrics import RouterMetrics
from router.observability.telemetry import Telemetry
from router.placement.worker_view import WorkerView
from tests.fake_clock import Clock


def test_summary_is_nearest_rank() -> None:
    got = summarize([float(v) for v in reversed(range(1, 101))])
    assert got == LatencySummary(100, 50.5, 50.0, 90.0, 99.0, 100.0)
    assert summarize([0.25]) == LatencySummary(1, 0.25, 0.25, 0.25, 0.25, 0.25)
    assert summarize([]) == LatencySummary(0, None, None, None, None, None)


def test_window_forgets_old_samples_and_keeps_the_latest() -> None:
    clock = Clock()
    window = LatencyWindow(clock, window_s=60.0, max_samples=3)
    window.add(1.0)
    clock.now += 30
    for value in (2.0, -1.0, math.nan, math.inf):  # only the first is a sample
        window.add(value)
    assert window.summary().count == 2
    clock.now += 30  # the first sample is 60 s old: out
    assert window.summary() == summarize([2.0])
    for value in (3.0, 4.0, 5.0):
        window.add(value)
    assert window.summary() == summarize([3.0, 4.0, 5.0])  # at most 3: the latest
    clock.now += 61
    assert window.summary().count == 0


def test_telemetry_feeds_what_the_histograms_observe() -> None:
    clock = Clock()
    latency = LiveLatency(clock)
    telemetry = Telemetry(RouterMetrics(), CacheStats(), None, latency)
    telemetry.on_first_token("disagg", "p-0", 0.2)
    telemetry.on_chunk("disagg", "d-0", 0.03, 3)
    telemetry.on_chunk("disagg", "d-0", 0.02, 0)  # a chunk counts as one token at least
    telemetry.on_prefill("p-0", pb.PromptUsage(prompt_tokens=4, computed_tokens=4), None)
    assert latency.ttft.summary() == summarize([0.2])
    assert latency.itl.summary().count == 2
    assert latency.itl.summary().max_s == pytest.approx(0.02)
    assert latency.itl.summary().p50_s == pytest.approx(0.01)


def test_controller_part_shows_the_latest_decisions_newest_first() -> None:
    lease = ControllerLease(ClusterConfig(), "r0", 3.0)  # never used: no Redis needed
    controller = RoleController(RouterConfig(), WorkerView(ClusterConfig()), RouterMetrics(),
                                lease, clock=lambda: 500.0)  # fmt: skip
    report = controller.report()
    for n in range(DECISIONS + 2):  # as RoleController.tick and _move write them
        change = RoleChange(f"decode-{n}", "decode", "prefill", f"ttft pressure {n}", 100.0 + n)
        entry = {**change.as_dict(), "result": "completed", "completed_at": 101.0 + n}
        report["history"].append(entry)
    report["history"][-2].update(result="failed", error="UNAVAILABLE: gone")
    report["history"][-1].update(result=None, completed_at=None)
    got = controller_status(report)
    assert not got.enabled and got.verdict == "ok" and got.decisions_total == DECISIONS + 2
    assert (got.ttft_slo_s, got.tpot_slo_s, got.target) == (2.0, 0.1, 0.9)
    assert [d.worker_id for d in got.decisions] == [f"decode-{n}" for n in range(11, 1, -1)]
    newest, failed = got.decisions[0], got.decisions[1]
    assert (newest.result, newest.ago_s, newest.error) == (None, 500.0 - 111.0, None)
    assert (failed.result, failed.error) == ("failed", "UNAVAILABLE: gone")
    assert newest.reason == "ttft pressure 11" and newest.to_role == "prefill"
    assert controller_status(report, last=0).decisions == []
