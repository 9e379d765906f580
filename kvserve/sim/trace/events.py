"""KV events from the simulated workers to a real router index, late as in the live system.

The cluster replay's ``+events`` policies (:mod:`kvserve.sim.trace.cluster`) take their
local-cache hints from a :class:`router.placement.prefix_index.PrefixIndex` fed the way the live
router's is: each worker's :class:`~workers.core.block_pool.BlockPool` logs its KV events
(``log_events`` when the feed starts), the worker drains them after each admission
(``take_events``) and publishes them as :class:`proto.kv_events.EventBatch` deltas (its own
seq from 0, at most :data:`proto.kv_events.MAX_EVENTS` events each), and the index applies
a batch when it arrives (:class:`EventTiming`). A worker's batches arrive in seq order: one
never overtakes an earlier one (it waits for it). Every batch must apply cleanly
(:attr:`router.placement.prefix_index.Outcome.APPLIED`); anything else is a bug, raised. Pure.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from kvserve.sim.trace.workers import SimWorker
from proto.kv_events import MAX_EVENTS, EventBatch
from router.placement.expected_blocks import ExpectedBlocks
from router.placement.prefix_index import Outcome, PrefixIndex

INCARNATION = 0.0
"""Every simulated worker's incarnation (none restarts)."""


@dataclass(frozen=True)
class EventTiming:
    """When a request's events reach the index. ``at_prefill_end``: when its prefill ends
    (its blocks are computed then; the evictions its admission caused travel with them);
    else at its admission (no delay: the index then mirrors the caches exactly). Either
    way plus ``lag_s`` seconds (publishing and reading)."""

    at_prefill_end: bool = True
    lag_s: float = 0.0

    def __post_init__(self) -> None:
        if not self.lag_s >= 0:
            raise ValueError(f"lag_s must be >= 0, got {self.lag_s}")

    def arrival(self, admitted_at: float, prefill_end: float) -> float:
        """When events published for a request admitted at ``admitted_at`` arrive."""
        return (prefill_end if self.at_prefill_end else admitted_at) + self.lag_s


class EventFeed:
    """Carries the KV events of ``workers`` to :attr:`index` (module docstring). Starts
    their event logs; their caches must be empty then (a new worker publishes no
    snapshot)."""

    def __init__(self, workers: Sequence[SimWorker], timing: EventTiming) -> None:
        self.index = PrefixIndex()
        self.expected = ExpectedBlocks()
        self.timing = timing
        self._seq: dict[str, int] = {}
        self._last: dict[str, float] = {}
        self._queue: list[tuple[float, int, EventBatch]] = []
        self._order = itertools.count()
        for worker in workers:
            if worker.pool.cached_names():
                raise ValueError(f"{worker.worker_id}: a fed worker must start empty")
            worker.pool.log_events()
            self._seq[worker.worker_id] = 0
            self._last[worker.worker_id] = float("-inf")

    def publish(self, worker: SimWorker, admitted_at: float, prefill_end: float) -> None:
        """Drain ``worker``'s events (those of the request just admitted) into batches
        that arrive at :meth:`EventTiming.arrival`, not before its earlier batches."""
        events = worker.pool.take_events()
        if not events:
            return
        wid = worker.worker_id
        at = max(self.timing.arrival(admitted_at, prefill_end), self._last[wid])
        self._last[wid] = at
        for start in range(0, len(events), MAX_EVENTS):
            chunk = tuple(events[start : start + MAX_EVENTS])
            batch = EventBatch(wid, INCARNATION, self._seq[wid], chunk)
            self._seq[wid] += 1
            heapq.heappush(self._queue, (at, next(self._order), batch))

    def deliver(self, now: float) -> None:
        """Apply, in arrival order, every batch that arrived by ``now``."""
        while self._queue and self._queue[0][0] <= now:
            _, _, batch = heapq.heappop(self._queue)
            outcome = self.index.apply(batch)
            if outcome is not Outcome.APPLIED:
                raise RuntimeError(f"batch {batch.worker_id}#{batch.seq}: {outcome}")
            self.expected.observe(batch)

    def placed(
        self, worker_ids: Sequence[str], chain: Sequence[int], now: float, prefill_end: float
    ) -> None:
        """The router placed a request of prompt ``chain`` on ``worker_ids`` at ``now``: it
        expects them to hold its blocks until their events for it arrive
        (:meth:`EventTiming.arrival`; at once without delay, so the hints stay exact)."""
        self.expected.placed(worker_ids, chain, now, self.timing.arrival(now, prefill_end))

    def matched(self, chain: Sequence[int], now: float) -> dict[str, int]:
        """Per known worker, the leading blocks of ``chain`` the index says it holds,
        continued by what the router's own placements expect it to hold."""
        return self.expected.extend(self.index.matched_all(chain), chain, now)
