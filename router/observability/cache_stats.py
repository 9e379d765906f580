"""Where prompt tokens came from: the numbers behind ``GET /v1/cache/stats``. Pure.

One :meth:`CacheStats.record` per finished prefill, with the usage that the worker which
did the prefill reported: ``local`` tokens from its own prefix cache, ``pool`` tokens
loaded from the shared pool, ``computed`` tokens it computed.

Two windows: ``last_minute`` (a sliding 60 s window on the injected clock) and
``since_start``. Per window, overall and per worker:

- token-weighted rates: ``local``, ``pool`` and ``miss`` = the sums of local, pool and
  computed tokens over the sum of prompt tokens;
- request-weighted rates ("any hit"): ``local`` = share of requests with any local token,
  ``pool`` = share with any pool token, ``miss`` = share with neither. A request with
  both counts in ``local`` and in ``pool``, so these three need not sum to 1.

``local_prediction``: over the prefills for which the router's prefix index predicted
the worker's local hit (:mod:`router.placement.kv_index`), the predicted and the actual local tokens
summed, and the share of those prefills where the two were equal; a gap between them is
index drift.

A rate over nothing (no request, no token) is ``None``.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

WINDOW_S = 60.0


@dataclass(frozen=True)
class PrefillRecord:
    worker_id: str
    prompt_tokens: int
    local_tokens: int
    pool_tokens: int
    computed_tokens: int
    predicted_local_tokens: int | None = None
    """What the router's prefix index predicted ``local_tokens`` to be (None: no
    prediction: the index did not know the worker's cache)."""


@dataclass
class Totals:
    """Sums over a set of prefill records."""

    requests: int = 0
    prompt_tokens: int = 0
    local_tokens: int = 0
    pool_tokens: int = 0
    computed_tokens: int = 0
    requests_local: int = 0
    requests_pool: int = 0
    requests_miss: int = 0
    predicted_requests: int = 0
    predicted_local_tokens: int = 0
    predicted_actual_local_tokens: int = 0
    predicted_exact: int = 0

    def add(self, r: PrefillRecord) -> None:
        self.requests += 1
        self.prompt_tokens += r.prompt_tokens
        self.local_tokens += r.local_tokens
        self.pool_tokens += r.pool_tokens
        self.computed_tokens += r.computed_tokens
        self.requests_local += r.local_tokens > 0
        self.requests_pool += r.pool_tokens > 0
        self.requests_miss += r.local_tokens == 0 and r.pool_tokens == 0
        if r.predicted_local_tokens is not None:
            self.predicted_requests += 1
            self.predicted_local_tokens += r.predicted_local_tokens
            self.predicted_actual_local_tokens += r.local_tokens
            self.predicted_exact += r.predicted_local_tokens == r.local_tokens

    def to_json(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "prompt_tokens": self.prompt_tokens,
            "local_tokens": self.local_tokens,
            "pool_tokens": self.pool_tokens,
            "computed_tokens": self.computed_tokens,
            "token_rates": {
                "local": _rate(self.local_tokens, self.prompt_tokens),
                "pool": _rate(self.pool_tokens, self.prompt_tokens),
                "miss": _rate(self.computed_tokens, self.prompt_tokens),
            },
            "request_rates": {
                "local": _rate(self.requests_local, self.requests),
                "pool": _rate(self.requests_pool, self.requests),
                "miss": _rate(self.requests_miss, self.requests),
            },
            "local_prediction": {
                "requests": self.predicted_requests,
                "predicted_local_tokens": self.predicted_local_tokens,
                "actual_local_tokens": self.predicted_actual_local_tokens,
                "exact_rate": _rate(self.predicted_exact, self.predicted_requests),
            },
        }


def _rate(part: int, whole: int) -> float | None:
    return part / whole if whole else None


@dataclass
class Breakdown:
    """Totals overall and per worker."""

    overall: Totals
    workers: dict[str, Totals]

    @classmethod
    def of(cls, records: Iterable[PrefillRecord]) -> Breakdown:
        out = cls(Totals(), {})
        for r in records:
            out.add(r)
        return out

    def add(self, r: PrefillRecord) -> None:
        self.overall.add(r)
        self.workers.setdefault(r.worker_id, Totals()).add(r)

    def to_json(self) -> dict[str, Any]:
        return {
            "overall": self.overall.to_json(),
            "workers": {w: t.to_json() for w, t in sorted(self.workers.items())},
        }


class CacheStats:
    """Lifecycle: created with the app -> :meth:`record` per finished prefill (one event
    loop; not thread-safe) -> :meth:`report` on each ``/v1/cache/stats`` request."""

    def __init__(
        self, clock: Callable[[], float] = time.monotonic, window_s: float = WINDOW_S
    ) -> None:
        self._clock = clock
        self._window_s = window_s
        self._recent: deque[tuple[float, PrefillRecord]] = deque()
        self._since_start = Breakdown.of(())

    def record(self, r: PrefillRecord) -> None:
        self._recent.append((self._clock(), r))
        self._since_start.add(r)
        self._prune()

    def report(self) -> dict[str, Any]:
        """``{"last_minute": breakdown, "since_start": breakdown}`` (see the module doc)."""
        self._prune()
        return {
            "last_minute": Breakdown.of(r for _, r in self._recent).to_json(),
            "since_start": self._since_start.to_json(),
        }

    def _prune(self) -> None:
        horizon = self._clock() - self._window_s
        while self._recent and self._recent[0][0] <= horizon:
            self._recent.popleft()
