"""Arrival processes: reproducible with a seed, with the statistics they promise."""

from __future__ import annotations

import itertools
import math
import statistics

import pytest

from kvserve.loadgen.arrivals import (
    arrival_times,
    gamma_arrivals,
    poisson_arrivals,
    trace_arrivals,
)

N = 20_000


def gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in itertools.pairwise(times)]


def test_poisson_is_seeded_and_has_mean_gap_one_over_rate() -> None:
    times = poisson_arrivals(N, rate=4.0, seed=7)
    assert times == poisson_arrivals(N, rate=4.0, seed=7)
    assert times != poisson_arrivals(N, rate=4.0, seed=8)
    assert times[0] == 0.0 and times == sorted(times)
    g = gaps(times)
    assert statistics.mean(g) == pytest.approx(0.25, rel=0.03)
    assert statistics.stdev(g) / statistics.mean(g) == pytest.approx(1.0, rel=0.05)


@pytest.mark.parametrize("cv", [0.5, 2.0])
def test_gamma_has_the_mean_and_cv_asked_for(cv: float) -> None:
    g = gaps(gamma_arrivals(N, rate=2.0, cv=cv, seed=1))
    assert statistics.mean(g) == pytest.approx(0.5, rel=0.05)
    assert statistics.stdev(g) / statistics.mean(g) == pytest.approx(cv, rel=0.08)


def test_infinite_rate_sends_everything_at_once() -> None:
    assert poisson_arrivals(3, math.inf, 0) == [0.0, 0.0, 0.0]
    assert gamma_arrivals(2, math.inf, 2.0, 0) == [0.0, 0.0]
    assert poisson_arrivals(0, 1.0, 0) == []


def test_trace_arrivals_shift_scale_and_rescale_to_a_rate() -> None:
    assert trace_arrivals([1.0, 1.5, 3.0], time_scale=2.0) == [0.0, 1.0, 4.0]
    # 2 gaps over a 2 s span is 1 req/s; at 4 req/s the span is 0.5 s
    assert trace_arrivals([1.0, 1.5, 3.0], rate=4.0) == pytest.approx([0.0, 0.125, 0.5])
    assert trace_arrivals([1.0, 2.0], rate=math.inf) == [0.0, 0.0]


def test_dispatch_checks_its_inputs() -> None:
    assert arrival_times("poisson", 5, 2.0, 3) == poisson_arrivals(5, 2.0, 3)
    assert arrival_times("gamma", 5, 2.0, 3, cv=1.5) == gamma_arrivals(5, 2.0, 1.5, 3)
    assert arrival_times("trace", 2, None, 0, timestamps_s=[0.0, 1.0], time_scale=3) == [0, 3]
    with pytest.raises(ValueError, match="rate"):
        arrival_times("poisson", 5, None, 0)
    with pytest.raises(ValueError, match="unknown"):
        arrival_times("uniform", 5, 1.0, 0)
    with pytest.raises(ValueError, match="timestamp"):
        arrival_times("trace", 2, None, 0, timestamps_s=[0.0])
