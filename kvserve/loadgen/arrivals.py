"""Arrival processes: seconds from the run's start at which each request is sent, purely.

- ``poisson``: exponential inter-arrival gaps with mean ``1 / rate``;
- ``gamma``: gamma-distributed gaps with mean ``1 / rate`` and coefficient of variation
  ``cv`` (shape ``k = 1 / cv**2``, scale ``1 / (rate * k)``): ``cv = 1`` is Poisson, ``cv > 1``
  bursty, ``cv < 1`` smoother than Poisson (vLLM's ``--burstiness`` is ``k``);
- ``trace``: given timestamps, shifted to start at 0 and multiplied by ``time_scale`` (2.0
  replays twice as slowly); with a ``rate`` instead, scaled so that the mean rate over the
  trace's span, ``(n - 1) / span``, equals ``rate`` (the burst shape is kept).

A rate of ``inf`` sends every request at time 0. The first request arrives at 0 for
``poisson`` and ``gamma`` too (the run starts with a request, not with a wait), so ``n``
arrivals span ``n - 1`` gaps. Generators are :class:`random.Random` seeded by the caller.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

PROCESSES = ("poisson", "gamma", "trace")


def gaps_to_times(gaps: Sequence[float]) -> list[float]:
    """Arrival times ``[0, g0, g0 + g1, ...]`` (one more time than gaps)."""
    times, now = [0.0], 0.0
    for gap in gaps:
        now += gap
        times.append(now)
    return times


def gamma_arrivals(n: int, rate: float, cv: float, seed: int) -> list[float]:
    """``n`` arrival times with gamma gaps of mean ``1 / rate`` and CV ``cv``."""
    if n <= 0:
        return []
    if math.isinf(rate):
        return [0.0] * n
    if rate <= 0 or cv <= 0:
        raise ValueError(f"arrivals need rate > 0 and cv > 0, got rate={rate} cv={cv}")
    rng = random.Random(seed)
    shape = 1.0 / cv**2
    scale = 1.0 / (rate * shape)
    return gaps_to_times([rng.gammavariate(shape, scale) for _ in range(n - 1)])


def poisson_arrivals(n: int, rate: float, seed: int) -> list[float]:
    """``n`` arrival times of a Poisson process of ``rate`` requests per second."""
    if n <= 0:
        return []
    if math.isinf(rate):
        return [0.0] * n
    if rate <= 0:
        raise ValueError(f"arrivals need rate > 0, got {rate}")
    rng = random.Random(seed)
    return gaps_to_times([rng.expovariate(rate) for _ in range(n - 1)])


def trace_arrivals(
    timestamps_s: Sequence[float], time_scale: float = 1.0, rate: float | None = None
) -> list[float]:
    """Trace timestamps from 0, times ``time_scale`` or rescaled to mean ``rate``."""
    if not timestamps_s:
        return []
    first = min(timestamps_s)
    shifted = [t - first for t in timestamps_s]
    span = max(shifted)
    if rate is not None:
        if math.isinf(rate) or span == 0:
            return [0.0] * len(shifted)
        time_scale = (len(shifted) - 1) / (span * rate)
    if time_scale <= 0:
        raise ValueError(f"time scale must be positive, got {time_scale}")
    return [t * time_scale for t in shifted]


def arrival_times(
    process: str,
    n: int,
    rate: float | None,
    seed: int,
    cv: float = 1.0,
    timestamps_s: Sequence[float] = (),
    time_scale: float = 1.0,
) -> list[float]:
    """Dispatch on ``process`` (one of :data:`PROCESSES`); ``rate`` None only for trace."""
    if process == "trace":
        if len(timestamps_s) != n:
            raise ValueError("trace arrivals need one timestamp per request")
        return trace_arrivals(timestamps_s, time_scale, rate)
    if rate is None:
        raise ValueError(f"{process} arrivals need a rate (--rates)")
    if process == "poisson":
        return poisson_arrivals(n, rate, seed)
    if process == "gamma":
        return gamma_arrivals(n, rate, cv, seed)
    raise ValueError(f"unknown arrival process {process!r}; one of {PROCESSES}")
