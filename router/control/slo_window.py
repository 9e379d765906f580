"""The sliding window of finished requests that the P:D ratio controller judges. Pure."""

from __future__ import annotations

import bisect
import math


class SloWindow:
    """Finished requests of the last ``window_s`` seconds (by finish time), as SLO hits.

    A sample counts at ``now`` while ``now - window_s < finished_s <= now``.
    :meth:`attainment` gives, per metric, the fraction of samples that met the SLO, or None
    when that metric has fewer than ``min_samples`` samples.
    """

    def __init__(
        self, ttft_slo_s: float, tpot_slo_s: float, window_s: float, min_samples: int = 1
    ) -> None:
        self.ttft_slo_s = ttft_slo_s
        self.tpot_slo_s = tpot_slo_s
        self.window_s = window_s
        self.min_samples = min_samples
        self._finished: list[float] = []  # sorted finish times
        self._hits: list[tuple[bool, bool | None]] = []  # (ttft met, tpot met or no sample)

    def add(self, finished_s: float, ttft_s: float | None, tpot_s: float | None) -> None:
        """One finished request; ``ttft_s`` None = failed (a TTFT miss, no TPOT sample)."""
        ttft_ok = ttft_s is not None and ttft_s <= self.ttft_slo_s
        tpot_ok = None if ttft_s is None or tpot_s is None else tpot_s <= self.tpot_slo_s
        at = bisect.bisect_right(self._finished, finished_s)
        self._finished.insert(at, finished_s)
        self._hits.insert(at, (ttft_ok, tpot_ok))

    def clear_before(self, t: float) -> None:
        """Forget the samples that finished before ``t``."""
        cut = bisect.bisect_left(self._finished, t)
        del self._finished[:cut], self._hits[:cut]

    def counts(self, now_s: float) -> tuple[int, int]:
        """``(ttft samples, tpot samples)`` in the window at ``now_s``."""
        hits = self._current(now_s)
        return len(hits), sum(tpot is not None for _, tpot in hits)

    def attainment(self, now_s: float) -> tuple[float | None, float | None, int]:
        """``(ttft attainment, tpot attainment, requests in the window)`` at ``now_s``."""
        hits = self._current(now_s)
        ttft = [ok for ok, _ in hits]
        tpot = [ok for _, ok in hits if ok is not None]
        return self._fraction(ttft), self._fraction(tpot), len(hits)

    def _fraction(self, hits: list[bool]) -> float | None:
        return sum(hits) / len(hits) if len(hits) >= self.min_samples else None

    def _current(self, now_s: float) -> list[tuple[bool, bool | None]]:
        self.clear_before(math.nextafter(now_s - self.window_s, math.inf))
        end = bisect.bisect_right(self._finished, now_s)
        return self._hits[:end]
