"""The controller's I/O side without I/O: flow results into the SLO window, the report."""

from __future__ import annotations

import pytest

from proto.registry import ClusterConfig
from router.config import RouterConfig
from router.control.controller import RoleController
from router.control.lease import ControllerLease
from router.control.ratio import RatioConfig
from router.flow.types import FlowResult
from router.observability.metrics import RouterMetrics
from router.placement.worker_view import WorkerView


def test_tpot_is_time_per_token_after_the_first() -> None:
    assert FlowResult("local", "d", "ok", 2.5, 0.5, 5).tpot_s == pytest.approx(0.5)
    assert FlowResult("local", "d", "ok", 2.5, 0.5, 1).tpot_s is None
    assert FlowResult("local", "d", "error", 2.5, None, 0).tpot_s is None


def test_flow_results_feed_the_window_and_the_report() -> None:
    config = RouterConfig(ratio=RatioConfig(min_samples=1, tpot_slo_s=0.1))
    view = WorkerView(ClusterConfig())  # never started: no Redis needed
    lease = ControllerLease(ClusterConfig(), "r0", 3.0)  # never taken: no Redis needed
    controller = RoleController(config, view, RouterMetrics(), lease, clock=lambda: 10.0)
    controller.record(FlowResult("disagg", "d", "ok", 2.5, 0.5, 5))  # TTFT met, TPOT 0.5
    controller.record(FlowResult("local", "d", "error", 1.0, 0.2, 3))  # failed: TTFT miss
    controller.record(FlowResult("local", "d", "cancelled", 1.0, None, 0))  # not a sample
    report = controller.report()
    assert not report["enabled"] and report["now_s"] == 10.0 and report["history"] == []
    assert report["lease"] == {"holder": None, "held_here": False}
    assert report["config"]["tpot_slo_s"] == 0.1
    snapshot = report["snapshot"]
    assert snapshot["samples"] == {"ttft": 2, "tpot": 1}
    assert (snapshot["ttft_attainment"], snapshot["tpot_attainment"]) == (0.5, 0.0)
    assert controller.tick() is None  # no live worker, nothing to move
    text = controller.metrics.render().decode()
    assert 'kvserve:slo_attainment{metric="ttft"} 0.5' in text
    assert "kvserve:controller_leader 0.0" in text
