"""The P:D ratio policy (router.control.ratio), pinned rule by rule, plus invariants under
hypothesis."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router.control.ratio import RETRY_DELAY_S, RatioConfig, RatioController, RoleChange, SloWindow
from router.placement.policies import WorkerLoad

CFG = RatioConfig(
    ttft_slo_s=1.0, tpot_slo_s=0.1, target=0.9, window_s=30.0, min_samples=3, patience=2,
    cooldown_s=60.0,
)  # fmt: skip
D1 = WorkerLoad("d1", "decode", running=2, free_pages=90, total_pages=100)
D2 = WorkerLoad("d2", "decode", running=1, waiting=1, free_pages=50, total_pages=100)
D3 = WorkerLoad("d3", "decode", running=1, free_pages=80, total_pages=100)
P1 = WorkerLoad("p1", "prefill", queued_prefill_tokens=500)
P2 = WorkerLoad("p2", "prefill", queued_prefill_tokens=100)
M1 = WorkerLoad("m1", "mixed")
DECODERS = [D1, D2, D3]


def feed(ctl: RatioController, t: float, n: int, ttft: float | None, tpot: float | None) -> None:
    for i in range(n):
        ctl.record(t - i * 0.01, ttft, tpot)


def ttft_missing(cfg: RatioConfig = CFG) -> RatioController:
    ctl = RatioController(cfg)
    feed(ctl, 10.0, 5, ttft=5.0, tpot=0.01)
    return ctl


def tpot_missing(cfg: RatioConfig = CFG) -> RatioController:
    ctl = RatioController(cfg)
    feed(ctl, 10.0, 5, ttft=0.1, tpot=0.5)
    return ctl


def decide_n(
    ctl: RatioController, times: Sequence[float], workers: Sequence[WorkerLoad]
) -> list[RoleChange | None]:
    return [ctl.decide(t, workers) for t in times]


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"ttft_slo_s": 0.0}, "ttft_slo_s"),
        ({"tpot_slo_s": -1.0}, "tpot_slo_s"),
        ({"window_s": float("inf")}, "window_s"),
        ({"target": 0.0}, "target"),
        ({"target": 1.5}, "target"),
        ({"min_samples": 0}, "min_samples"),
        ({"patience": 0}, "patience"),
        ({"cooldown_s": -1.0}, "cooldown_s"),
        ({"min_prefill": 3, "max_prefill": 2}, "min_prefill"),
        ({"min_decode": 0}, "always needs a decode worker"),
        ({"min_decode": 5, "max_decode": 4}, "min_decode"),
    ],
)
def test_config_rejects_bad_values(fields: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        replace(CFG, **fields)  # type: ignore[arg-type]


def test_window_attainment_samples_and_expiry() -> None:
    w = SloWindow(ttft_slo_s=1.0, tpot_slo_s=0.1, window_s=10.0, min_samples=2)
    w.add(1.0, 0.5, 0.05)  # meets both
    assert w.attainment(1.0) == (None, None, 1)  # one sample: no verdict yet
    w.add(2.0, 1.0, 0.2)  # ttft at the SLO meets it; tpot misses
    w.add(3.0, None, None)  # failed: a TTFT miss, no TPOT sample
    w.add(4.0, 0.2, None)  # one output token: no TPOT sample
    assert w.attainment(4.0) == (0.75, 0.5, 4)
    assert w.counts(4.0) == (4, 2)
    assert w.attainment(11.0) == (2 / 3, None, 3)  # the sample at 1.0 left at 11.0
    assert w.attainment(12.5) == (0.5, None, 2)
    assert w.attainment(100.0) == (None, None, 0)


def test_window_keeps_finish_time_order_and_clears_before() -> None:
    w = SloWindow(ttft_slo_s=1.0, tpot_slo_s=0.1, window_s=10.0)
    w.add(5.0, 0.1, 0.01)
    w.add(2.0, 9.0, 9.0)  # late report of an earlier finish
    w.add(6.0, 9.0, 0.01)
    assert w.attainment(6.0) == (1 / 3, 2 / 3, 3)
    assert w.attainment(5.5) == (0.5, 0.5, 2)  # the sample at 6.0 is not in yet
    w.clear_before(5.0)
    assert w.attainment(6.0) == (0.5, 1.0, 2)


def test_ttft_miss_waits_for_patience_then_moves_the_idlest_decoder() -> None:
    ctl = ttft_missing()
    assert ctl.decide(10.0, DECODERS) is None
    assert ctl.snapshot(10.0)["streaks"] == {"ttft": 1, "tpot": 0, "both": 0}
    change = ctl.decide(15.0, DECODERS)
    # d1: 2 requests; d2: 2 requests, 50 used pages; d3: 1 request -> d3
    assert change == RoleChange("d3", "decode", "prefill", "ttft attainment 0.00 < 0.90 "
                                "(tpot 1.00)", 15.0)  # fmt: skip
    assert ctl.history == (change,)


def test_decoder_choice_breaks_ties_by_used_pages_then_id() -> None:
    a = WorkerLoad("a", "decode", running=1, free_pages=10, total_pages=100)
    b = WorkerLoad("b", "decode", waiting=1, free_pages=60, total_pages=100)
    c = WorkerLoad("c", "decode", running=1, free_pages=60, total_pages=100)
    ctl = ttft_missing(replace(CFG, patience=1))
    change = ctl.decide(10.0, [c, a, b])
    assert change is not None and change.worker_id == "b"


def test_tpot_miss_moves_the_prefill_worker_with_the_shortest_queue() -> None:
    ctl = tpot_missing()
    workers = [P1, P2, D1]
    assert ctl.decide(10.0, workers) is None
    change = ctl.decide(11.0, workers)
    assert change == RoleChange("p2", "prefill", "decode", "tpot attainment 0.00 < 0.90 "
                                "(ttft 1.00)", 11.0)  # fmt: skip
    tie = replace(P1, queued_prefill_tokens=100, worker_id="p0")
    ctl = tpot_missing(replace(CFG, patience=1))
    moved = ctl.decide(10.0, [P2, tie, D1])
    assert moved is not None and moved.worker_id == "p0"


def test_a_broken_streak_starts_over() -> None:
    ctl = ttft_missing()
    assert ctl.decide(10.0, DECODERS) is None
    feed(ctl, 10.5, 50, ttft=0.1, tpot=0.01)  # attainment recovers: 50/55
    assert ctl.decide(11.0, DECODERS) is None
    assert ctl.snapshot(11.0)["verdict"] == "ok"
    feed(ctl, 12.0, 50, ttft=9.0, tpot=0.01)
    assert ctl.decide(12.0, DECODERS) is None  # streak 1 again
    assert ctl.decide(13.0, DECODERS) is not None


@pytest.mark.parametrize(
    ("cfg", "workers", "blocked"),
    [
        (replace(CFG, min_decode=3), DECODERS, "3 decode (min 3)"),
        (replace(CFG, max_prefill=1), [P1, D1, D2], "1 prefill (max 1)"),
    ],
)
def test_ttft_bounds(cfg: RatioConfig, workers: list[WorkerLoad], blocked: str) -> None:
    ctl = ttft_missing(cfg)
    assert decide_n(ctl, [10.0, 11.0, 12.0], workers) == [None] * 3
    assert blocked in ctl.snapshot(12.0)["blocked"]


@pytest.mark.parametrize(
    ("cfg", "workers", "blocked"),
    [
        (replace(CFG, min_prefill=2), [P1, P2, D1], "2 prefill (min 2)"),
        (replace(CFG, max_decode=1), [P1, D1], "1 decode (max 1)"),
    ],
)
def test_tpot_bounds(cfg: RatioConfig, workers: list[WorkerLoad], blocked: str) -> None:
    ctl = tpot_missing(cfg)
    assert decide_n(ctl, [10.0, 11.0, 12.0], workers) == [None] * 3
    assert blocked in ctl.snapshot(12.0)["blocked"]


def test_both_missing_moves_nothing_and_says_so() -> None:
    ctl = RatioController(CFG)
    feed(ctl, 10.0, 5, ttft=5.0, tpot=0.5)
    assert decide_n(ctl, [10.0, 11.0, 12.0], [P1, D1, D2]) == [None] * 3
    snap = ctl.snapshot(12.0)
    assert snap["short_of_hardware"] and snap["streaks"]["both"] == 3
    assert "short of hardware" in snap["blocked"]


def test_mixed_workers_are_never_moved() -> None:
    ctl = ttft_missing()
    assert decide_n(ctl, [10.0, 11.0], [M1, D1]) == [None, None]  # one decode: the minimum
    ctl = tpot_missing()
    assert decide_n(ctl, [10.0, 11.0], [M1, D1]) == [None, None]  # no prefill worker


def test_nothing_is_decided_while_a_change_is_in_flight() -> None:
    ctl = ttft_missing(replace(CFG, patience=1, cooldown_s=0.0))
    change = ctl.decide(10.0, DECODERS)
    assert change is not None and ctl.in_flight == change
    assert ctl.decide(11.0, DECODERS) is None
    assert ctl.snapshot(11.0)["in_flight"] == change.as_dict()
    with pytest.raises(ValueError, match="not the change in flight"):
        ctl.completed(replace(change, worker_id="d1"), 12.0)
    ctl.failed(change, 12.0)  # cooldown 0: no retry delay either
    feed(ctl, 12.0, 5, ttft=5.0, tpot=0.01)
    assert ctl.decide(12.0, DECODERS) == replace(change, at_s=12.0)


def test_a_draining_worker_blocks_and_resets_the_streak() -> None:
    ctl = ttft_missing()
    assert ctl.decide(10.0, DECODERS) is None
    assert ctl.decide(11.0, [replace(D1, draining=True), D2, D3]) is None
    assert "draining: d1" in ctl.snapshot(11.0)["blocked"]
    assert ctl.decide(12.0, DECODERS) is None  # streak 1 again
    assert ctl.decide(13.0, DECODERS) is not None


def test_cooldown_after_completion_and_the_window_forgets_the_old_ratio() -> None:
    ctl = ttft_missing(replace(CFG, window_s=120.0))
    decide_n(ctl, [10.0], DECODERS)
    change = ctl.decide(11.0, DECODERS)
    assert change is not None
    ctl.completed(change, 20.0)
    workers = [D1, D2, replace(D3, role="prefill")]
    assert ctl.snapshot(20.0)["samples"] == {"ttft": 0, "tpot": 0}
    feed(ctl, 25.0, 5, ttft=5.0, tpot=0.01)  # still missing under the new ratio
    assert decide_n(ctl, [25.0, 30.0, 79.9], workers) == [None] * 3
    assert ctl.snapshot(79.9)["cooldown_remaining_s"] == pytest.approx(0.1)
    assert "cool-down" in ctl.snapshot(79.9)["blocked"]
    nxt = ctl.decide(80.0, workers)  # the streak went on counting during the cool-down
    assert nxt is not None and nxt.worker_id == "d1" and nxt.to_role == "prefill"


def test_a_controller_taking_over_waits_a_cooldown_with_a_fresh_window() -> None:
    """hold_off: a router that has just taken the controller's lease from another."""
    ctl = ttft_missing(replace(CFG, window_s=120.0))
    ctl.hold_off(20.0)
    assert ctl.snapshot(20.0)["samples"] == {"ttft": 0, "tpot": 0}
    assert ctl.snapshot(20.0)["cooldown_remaining_s"] == 60.0
    feed(ctl, 25.0, 5, ttft=5.0, tpot=0.01)
    assert decide_n(ctl, [25.0, 30.0, 79.9], DECODERS) == [None] * 3
    assert "cool-down" in ctl.snapshot(79.9)["blocked"]
    assert ctl.decide(80.0, DECODERS) is not None


def test_failure_waits_only_the_retry_delay() -> None:
    ctl = ttft_missing()
    decide_n(ctl, [10.0], DECODERS)
    change = ctl.decide(11.0, DECODERS)
    assert change is not None
    ctl.failed(change, 12.0)
    assert ctl.snapshot(12.0)["cooldown_remaining_s"] == RETRY_DELAY_S
    assert ctl.snapshot(12.0)["samples"]["ttft"] == 5  # the ratio did not change
    assert decide_n(ctl, [13.0, 14.0, 21.9], DECODERS) == [None] * 3
    assert ctl.decide(22.0, DECODERS) is not None


def test_queue_growth_without_samples_is_ttft_pressure() -> None:
    ctl = RatioController(CFG)
    # unmeasured speed: 2000 tokens/s, so a wait over half the 1 s SLO is > 1000 tokens
    queued = [replace(P1, queued_prefill_tokens=q) for q in (1000, 2000, 3000)]
    assert ctl.decide(1.0, [queued[0], D1, D2]) is None  # no baseline yet
    assert ctl.decide(2.0, [queued[1], D1, D2]) is None  # rising once
    change = ctl.decide(3.0, [queued[2], D1, D2])  # rising twice: patience 2
    assert change is not None and change.to_role == "prefill"
    assert change.reason == "prefill queue rising to 3000 tokens, too few TTFT samples (tpot n/a)"


def test_a_rising_queue_that_clears_well_within_the_slo_is_no_pressure() -> None:
    ctl = RatioController(CFG)
    small = [[replace(P1, queued_prefill_tokens=q), D1, D2] for q in (100, 400, 700, 1000)]
    assert decide_n_each(ctl, small) == [None] * 4  # 1000 tokens: 0.5 s, not over half
    slow = [replace(P1, queued_prefill_tokens=q, prefill_tokens_per_s=1000.0) for q in (1100, 1200)]
    assert ctl.decide(5.0, [slow[0], D1, D2]) is None  # 1.1 s at its measured speed: once
    assert ctl.decide(6.0, [slow[1], D1, D2]) is not None  # twice: patience 2


def decide_n_each(ctl: RatioController, views: list[list[WorkerLoad]]) -> list[RoleChange | None]:
    return [ctl.decide(1.0 + i, view) for i, view in enumerate(views)]


def test_queue_growth_counts_decoders_without_prefill_pool_and_needs_strict_rise() -> None:
    ctl = RatioController(CFG)
    flat = [replace(D1, queued_prefill_tokens=2500), D2]
    assert decide_n(ctl, [1.0, 2.0, 3.0, 4.0], flat) == [None] * 4
    rising = [[replace(D1, queued_prefill_tokens=2500 * k), D2] for k in (2, 3)]
    assert ctl.decide(5.0, rising[0]) is None
    assert ctl.decide(6.0, rising[1]) is not None


def test_queue_growth_is_ignored_once_ttft_has_samples() -> None:
    ctl = RatioController(CFG)
    feed(ctl, 1.0, 5, ttft=0.1, tpot=0.01)
    workers = [[replace(P1, queued_prefill_tokens=q), D1, D2] for q in (1, 2, 3, 4)]
    assert [ctl.decide(1.0 + i, w) for i, w in enumerate(workers)] == [None] * 4


def test_misses_that_leave_the_window_stop_counting() -> None:
    ctl = ttft_missing()
    assert ctl.decide(10.0, DECODERS) is None
    assert ctl.decide(40.0, DECODERS) is None  # window (10, 40]: every sample left
    assert ctl.snapshot(40.0)["ttft_attainment"] is None


# -- invariants ------------------------------------------------------------------------------
STEP = st.tuples(
    st.floats(0.1, 20.0),  # seconds to the next evaluation
    st.integers(0, 6),  # requests finished meanwhile
    st.floats(0.0, 3.0),  # their TTFT
    st.floats(0.0, 0.3),  # their TPOT
    st.integers(0, 3),  # evaluations a change takes to complete
    st.integers(0, 5000),  # prefill queue
    st.booleans(),  # the change fails
)


@settings(max_examples=150, deadline=None)
@given(st.lists(STEP, min_size=1, max_size=60), st.integers(0, 2), st.integers(1, 3))
def test_no_flapping_and_bounds_hold(
    steps: list[tuple[float, int, float, float, int, int, bool]], prefill: int, decode: int
) -> None:
    cfg = replace(CFG, patience=2, cooldown_s=30.0, min_prefill=0, max_prefill=3,
                  min_decode=1, max_decode=3)  # fmt: skip
    ctl = RatioController(cfg)
    roles = {f"w{i}": "prefill" if i < prefill else "decode" for i in range(prefill + decode)}
    now, pending, completed_at = 0.0, None, None
    evaluations_since_end = 0
    for gap, n, ttft, tpot, takes, queue, fails in steps:
        now += gap
        feed(ctl, now, n, ttft, tpot)
        if pending is not None:
            change, left = pending
            if left == 0:
                if fails:
                    ctl.failed(change, now)
                else:
                    roles[change.worker_id] = change.to_role
                    ctl.completed(change, now)
                    completed_at = now
                pending, evaluations_since_end = None, 0
            else:
                pending = (change, left - 1)
        workers = [
            WorkerLoad(w, r, queued_prefill_tokens=queue if r == "prefill" else 0)
            for w, r in roles.items()
        ]
        decided = ctl.decide(now, workers)
        evaluations_since_end += 1
        if decided is None:
            continue
        assert pending is None  # one change at a time
        assert roles[decided.worker_id] == decided.from_role != decided.to_role
        assert evaluations_since_end >= cfg.patience  # hysteresis
        if completed_at is not None:
            assert now - completed_at >= cfg.cooldown_s  # cool-down after every move
        after = [r for w, r in roles.items() if w != decided.worker_id] + [decided.to_role]
        assert cfg.min_prefill <= after.count("prefill") <= max(cfg.max_prefill, prefill)
        assert cfg.min_decode <= after.count("decode") <= max(cfg.max_decode, decode)
        pending = (decided, takes)
