"""Live TTFT and ITL: the latencies of the last minute behind ``GET /v1/status``. Pure.

The Prometheus histograms of :mod:`router.observability.request_metrics` count since the start; the
status page wants what clients see now. :class:`LiveLatency` keeps the samples of the
last ``window_s`` seconds (on the injected clock) in two :class:`LatencyWindow`: one
TTFT sample per first token, one ITL sample per streamed chunk, as the histograms observe
them (:func:`router.observability.request_metrics.itl_of`). A window holds at most ``max_samples``
(the oldest go first), so a busy router's memory stays bounded; its summary is then that
of the latest ``max_samples`` samples of the window.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

WINDOW_S = 60.0
MAX_SAMPLES = 4096
QUANTILES = (0.5, 0.9, 0.99)


@dataclass(frozen=True)
class LatencySummary:
    """A window's samples (seconds): their count, and when there is one, their mean, the
    nearest-rank p50 / p90 / p99 and the largest (all None for an empty window)."""

    count: int
    mean_s: float | None = None
    p50_s: float | None = None
    p90_s: float | None = None
    p99_s: float | None = None
    max_s: float | None = None


def summarize(samples: list[float]) -> LatencySummary:
    """The :class:`LatencySummary` of ``samples`` (any order)."""
    if not samples:
        return LatencySummary(0)
    ordered = sorted(samples)
    n = len(ordered)
    p50, p90, p99 = (ordered[max(0, math.ceil(q * n) - 1)] for q in QUANTILES)
    return LatencySummary(n, sum(ordered) / n, p50, p90, p99, ordered[-1])


class LatencyWindow:
    """Latency samples of the last ``window_s`` seconds; one event loop, not thread-safe."""

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        window_s: float = WINDOW_S,
        max_samples: int = MAX_SAMPLES,
    ) -> None:
        self._clock = clock
        self._window_s = window_s
        self._samples: deque[tuple[float, float]] = deque(maxlen=max_samples)

    def add(self, seconds: float) -> None:
        """One sample, taken now; a negative or non-finite one is ignored."""
        if math.isfinite(seconds) and seconds >= 0:
            self._samples.append((self._clock(), seconds))

    def summary(self) -> LatencySummary:
        """The samples taken within the last ``window_s`` seconds, summarized."""
        horizon = self._clock() - self._window_s
        while self._samples and self._samples[0][0] <= horizon:
            self._samples.popleft()
        return summarize([s for _, s in self._samples])


class LiveLatency:
    """The TTFT and ITL windows that :class:`router.observability.telemetry.Telemetry` feeds."""

    def __init__(
        self, clock: Callable[[], float] = time.monotonic, window_s: float = WINDOW_S
    ) -> None:
        self.window_s = window_s
        self.ttft = LatencyWindow(clock, window_s)
        self.itl = LatencyWindow(clock, window_s)
