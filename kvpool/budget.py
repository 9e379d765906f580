"""The byte budget of chain eviction (:mod:`kvpool.evictor`): a share of the pool's
capacity as ``mooncake_master`` reports it (its members' segments come and go, so the
capacity is read again every ``refresh_s``).

Lifecycle of :class:`PoolBudget`: construct -> :meth:`start` (a daemon thread reads the
master's metrics page now and every ``refresh_s``) -> call it from any thread for the
budget -> :meth:`close`. Until a read succeeds, and while the master reports no capacity,
the budget is ``None`` (nothing is evicted by the writers; the master's own eviction still
guards the pool); a failed read keeps the last value and is logged at most once a minute.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from kvpool.master import MasterStats, master_stats_at

log = logging.getLogger(__name__)

REFRESH_S = 5.0
LOG_EVERY_S = 60.0
READ_TIMEOUT_S = 2.0


class PoolBudget:
    """``evict_at`` of the capacity on the metrics page ``url`` (module docstring)."""

    def __init__(
        self,
        url: str,
        evict_at: float,
        refresh_s: float = REFRESH_S,
        read: Callable[[str], MasterStats] = lambda u: master_stats_at(u, READ_TIMEOUT_S),
    ) -> None:
        if not 0 < evict_at <= 1 or refresh_s <= 0:
            raise ValueError("evict_at must be in (0, 1] and refresh_s positive")
        self.url = url
        self.evict_at = evict_at
        self.refresh_s = refresh_s
        self._read = read
        self.capacity_bytes = 0
        """The pool's capacity at the last successful read (0: unknown)."""
        self._logged_at = -LOG_EVERY_S
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __call__(self) -> int | None:
        """The bytes the pool's prefix blocks may take now, or ``None`` when unknown."""
        capacity = self.capacity_bytes
        return int(capacity * self.evict_at) if capacity > 0 else None

    def refresh(self) -> None:
        """Read the capacity once (a failure keeps the last value)."""
        try:
            self.capacity_bytes = self._read(self.url).capacity_bytes
        except Exception as exc:  # any failure to reach or parse the page: keep the last
            if time.monotonic() - self._logged_at >= LOG_EVERY_S:
                self._logged_at = time.monotonic()
                log.warning("cannot read the pool's capacity from %s: %s", self.url, exc)

    def start(self) -> PoolBudget:
        self._thread = threading.Thread(target=self._run, name="pool-budget", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        self.refresh()
        while not self._stop.wait(self.refresh_s):
            self.refresh()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=READ_TIMEOUT_S + 1)
