"""A cumulative histogram kept as plain numbers, so an engine's stats can carry one across
threads in its :class:`workers.core.engine_info.EngineLoad` snapshots (a deep copy) and a
scrape can export it (:mod:`workers.serve.metrics_http`) without the engine knowing Prometheus."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

QUEUE_BUCKETS = (
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
)  # fmt: skip
"""Bounds (seconds) of the queue-time histogram."""


@dataclass
class Buckets:
    """Observations counted per bucket (``counts[i]``: values in ``(bounds[i-1],
    bounds[i]]``; the last count: above every bound), with their ``total`` (sum)."""

    bounds: tuple[float, ...] = QUEUE_BUCKETS
    counts: list[int] = field(default_factory=list)
    total: float = 0.0

    def __post_init__(self) -> None:
        if list(self.bounds) != sorted(set(self.bounds)):
            raise ValueError(f"bounds must increase, got {self.bounds}")
        if not self.counts:
            self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        index = next((i for i, b in enumerate(self.bounds) if value <= b), len(self.bounds))
        self.counts[index] += 1
        self.total += value

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[str, float]]:
        """``(le, observations <= le)`` for every bound then ``+Inf``: Prometheus's form."""
        out: list[tuple[str, float]] = []
        running = 0
        for bound, n in zip((*self.bounds, math.inf), self.counts, strict=True):
            running += n
            out.append(("+Inf" if math.isinf(bound) else repr(float(bound)), float(running)))
        return out
