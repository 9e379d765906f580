"""What a worker's view of the pool counts (:class:`PoolStats`) and the leases of its
request-scoped partial blocks (:class:`Lease`, held in :class:`Leases`); both used by
:class:`kvpool.pool.KVPool`."""

from __future__ import annotations

import heapq
import threading
from dataclasses import dataclass
from typing import NamedTuple

from kvpool.tiers import TierStats


class Lease(NamedTuple):
    """A request-scoped partial block this writer removes at ``expires`` (``time.time()``)
    unless the decode side took it first (ordered by expiry: :meth:`KVPool.sweep`)."""

    expires: float
    request_id: str


class Leases:
    """The partial blocks a writer leased, soonest expiry first; thread-safe (a push's last
    step leases from the kv-write thread, the engine sweeps)."""

    def __init__(self) -> None:
        self._heap: list[Lease] = []
        self._lock = threading.Lock()

    def add(self, request_id: str, expires: float) -> None:
        with self._lock:
            heapq.heappush(self._heap, Lease(expires, request_id))

    def pop_expired(self, now: float) -> str | None:
        """The request id of a lease over at ``now`` (removed), or None when none is."""
        with self._lock:
            if not self._heap or self._heap[0].expires > now:
                return None
            return heapq.heappop(self._heap).request_id


@dataclass
class PoolStats(TierStats):
    """Counters since start (read by metrics exporters and benchmarks); with an SSD tier,
    :class:`~kvpool.tiers.TierStats` says which tier served the objects
    :meth:`~kvpool.pool.KVPool.load` read, and how long each tier's reads took."""

    blocks_written: int = 0
    """Blocks committed (full prefix blocks and request-scoped partial blocks)."""
    objects_written: int = 0
    bytes_written: int = 0
    objects_read: int = 0
    bytes_read: int = 0
    lookups: int = 0
    hit_blocks: int = 0
    miss_blocks: int = 0
    hit_tokens: int = 0
    miss_tokens: int = 0
    checksum_failures: int = 0
    short_reads: int = 0
    bad_meta: int = 0
    forged_blocks: int = 0
    """Metas that fit but whose MAC failed (written without the cluster secret, or moved
    from another block's name); such a block is never loaded, and removed."""
    healed_blocks: int = 0
    expired_requests: int = 0
    write_seconds: float = 0.0
    """Time spent in layer puts and meta commits (wherever they overlapped compute)."""
    read_seconds: float = 0.0
    lookup_seconds: float = 0.0
