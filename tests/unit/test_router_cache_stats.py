"""Cache-hit statistics: exact sums and rates, sliding window on a fake clock."""

from __future__ import annotations

from router.observability.cache_stats import CacheStats, PrefillRecord
from tests.fake_clock import Clock


def test_empty_report_has_no_rates() -> None:
    report = CacheStats(Clock()).report()
    for window in ("last_minute", "since_start"):
        overall = report[window]["overall"]
        assert overall["requests"] == 0
        assert overall["token_rates"] == {"local": None, "pool": None, "miss": None}
        assert overall["request_rates"] == {"local": None, "pool": None, "miss": None}
        assert report[window]["workers"] == {}


def test_token_and_request_rates_overall_and_per_worker() -> None:
    stats = CacheStats(Clock())
    stats.record(PrefillRecord("a", 100, local_tokens=50, pool_tokens=0, computed_tokens=50))
    stats.record(PrefillRecord("a", 100, local_tokens=0, pool_tokens=64, computed_tokens=36))
    stats.record(PrefillRecord("b", 200, local_tokens=0, pool_tokens=0, computed_tokens=200))
    stats.record(PrefillRecord("b", 400, local_tokens=100, pool_tokens=200, computed_tokens=100))
    overall = stats.report()["since_start"]["overall"]
    assert overall == {
        "requests": 4,
        "prompt_tokens": 800,
        "local_tokens": 150,
        "pool_tokens": 264,
        "computed_tokens": 386,
        "token_rates": {"local": 150 / 800, "pool": 264 / 800, "miss": 386 / 800},
        "request_rates": {"local": 0.5, "pool": 0.5, "miss": 0.25},
        "local_prediction": {
            "requests": 0,
            "predicted_local_tokens": 0,
            "actual_local_tokens": 0,
            "exact_rate": None,
        },
    }
    workers = stats.report()["since_start"]["workers"]
    assert list(workers) == ["a", "b"]
    assert workers["a"]["token_rates"] == {"local": 0.25, "pool": 0.32, "miss": 0.43}
    assert workers["a"]["request_rates"] == {"local": 0.5, "pool": 0.5, "miss": 0.0}
    assert workers["b"]["token_rates"] == {"local": 100 / 600, "pool": 200 / 600, "miss": 0.5}
    assert workers["b"]["request_rates"] == {"local": 0.5, "pool": 0.5, "miss": 0.5}


def test_last_minute_slides_since_start_keeps_all() -> None:
    clock = Clock()
    stats = CacheStats(clock)
    stats.record(PrefillRecord("a", 10, 10, 0, 0))
    clock.now += 30
    stats.record(PrefillRecord("a", 30, 0, 0, 30))
    clock.now += 29.5
    assert stats.report()["last_minute"]["overall"]["requests"] == 2
    clock.now += 0.5  # the first record is exactly 60 s old: out of the window
    report = stats.report()
    minute = report["last_minute"]["overall"]
    assert minute["requests"] == 1
    assert minute["token_rates"] == {"local": 0.0, "pool": 0.0, "miss": 1.0}
    assert report["since_start"]["overall"]["prompt_tokens"] == 40
    assert report["since_start"]["overall"]["request_rates"]["local"] == 0.5
    clock.now += 30
    report = stats.report()
    assert report["last_minute"]["overall"]["requests"] == 0
    assert report["last_minute"]["workers"] == {}
    assert report["since_start"]["workers"]["a"]["requests"] == 2


def test_predicted_local_hits_are_compared_with_the_actual_ones() -> None:
    """Only prefills with a prediction count; ``exact_rate`` is the share where the index
    was right, per worker and overall."""
    stats = CacheStats(Clock())
    stats.record(PrefillRecord("a", 100, 64, 0, 36, predicted_local_tokens=64))
    stats.record(PrefillRecord("a", 100, 32, 0, 68, predicted_local_tokens=64))  # stale
    stats.record(PrefillRecord("b", 100, 16, 0, 84, predicted_local_tokens=None))
    stats.record(PrefillRecord("b", 100, 16, 0, 84, predicted_local_tokens=0))  # late
    report = stats.report()["since_start"]
    assert report["overall"]["local_prediction"] == {
        "requests": 3,
        "predicted_local_tokens": 128,
        "actual_local_tokens": 112,
        "exact_rate": 1 / 3,
    }
    assert report["workers"]["a"]["local_prediction"]["exact_rate"] == 0.5
    assert report["workers"]["b"]["local_prediction"]["requests"] == 1
    assert report["workers"]["b"]["local_prediction"]["exact_rate"] == 0.0
