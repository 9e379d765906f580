"""What an engine tells other threads about itself, as immutable values.

The engine is confined to its thread (:mod:`workers.engine.loop`); the gRPC servicer, the
server and the heartbeat never read it directly. They read:

- :class:`EngineInfo`: facts fixed when the engine is built (published as
  ``Engine.info`` and ``EngineLoop.info``), safe to read from any thread;
- :class:`EngineLoad`: a snapshot of its queues, counters and pool health, taken on the
  engine thread by ``Engine.load`` (:meth:`EngineLoad.of`, through ``EngineLoop.call``)
  and then read anywhere.
"""

from __future__ import annotations

import copy
from collections.abc import Sized
from dataclasses import dataclass, field, replace

from kvpool.evictor import EvictionStats
from kvpool.pool import KVPool
from kvpool.tiers import TierStats
from workers.core.outputs import EngineStats
from workers.core.scheduler import Scheduler


@dataclass(frozen=True)
class EngineInfo:
    """Fixed facts of an engine: the longest sequence it takes (``max_model_len``), its KV
    pages (``num_blocks``), and whether it joined the KV pool (``pool_attached``: a
    ``prefill`` or ``decode`` role needs it)."""

    max_model_len: int
    num_blocks: int
    pool_attached: bool


@dataclass(frozen=True)
class PoolHealth:
    """The KV pool as one engine sees it: reachable now (``connected``: breaker closed and
    the client healthy), breaker openings (``outages``), blocks refused for a bad MAC
    (``forged_blocks``) or digest (``checksum_failures``), blocks removed for failing
    verification (``healed_blocks``), value reads given up (``reads_given_up``) and objects
    not read because only a member that did not answer lately held them
    (``objects_skipped``: :mod:`kvpool.peers`), chain-aware eviction's counters
    (:class:`kvpool.evictor.EvictionStats`), and with an SSD tier the objects loaded from
    each tier (``tiers``). All zero/False without a pool."""

    connected: bool = False
    outages: int = 0
    forged_blocks: int = 0
    checksum_failures: int = 0
    healed_blocks: int = 0
    reads_given_up: int = 0
    objects_skipped: int = 0
    eviction: EvictionStats = field(default_factory=EvictionStats)
    tiers: TierStats = field(default_factory=TierStats)

    @classmethod
    def of(cls, pool: KVPool | None, probe: bool = True) -> PoolHealth:
        """Read ``pool``'s health (on the thread that owns it; asks the client, and probes
        the master when its breaker's backoff has passed; ``probe=False``: neither, the
        breaker's state only, for a caller that must not wait)."""
        if pool is None:
            return cls()
        connected = (
            pool.store.available and pool.store.healthy() if probe else not pool.store.breaker_open
        )
        return cls(
            connected=connected,
            outages=pool.store.outages,
            forged_blocks=pool.stats.forged_blocks,
            checksum_failures=pool.stats.checksum_failures,
            healed_blocks=pool.stats.healed_blocks,
            reads_given_up=pool.store.given_up,
            objects_skipped=pool.store.peers.skipped,
            eviction=replace(pool.evictor.stats) if pool.evictor else EvictionStats(),
            tiers=TierStats(
                pool.stats.dram_objects,
                pool.stats.ssd_objects,
                pool.stats.dram_read_seconds,
                pool.stats.ssd_read_seconds,
            ),
        )


@dataclass(frozen=True)
class EngineLoad:
    """One snapshot of an engine's load: requests ``waiting`` and ``running``, pages
    ``reserved`` for remote prefills (reservations), prompt tokens still to compute
    (``queued_prefill_tokens``), ``free_pages`` of ``total_pages``, a copy of its
    ``stats`` and its ``pool`` health."""

    waiting: int
    running: int
    reserved: int
    queued_prefill_tokens: int
    free_pages: int
    total_pages: int
    stats: EngineStats
    pool: PoolHealth

    def __post_init__(self) -> None:
        object.__setattr__(self, "stats", copy.deepcopy(self.stats))  # never the live one

    @classmethod
    def of(
        cls, scheduler: Scheduler, reservations: Sized, stats: EngineStats, pool: KVPool | None
    ) -> EngineLoad:
        """Take the snapshot (on the engine thread: it reads the live queues, and asks the
        pool client for its health): ``reservations`` counts the live ones."""
        return cls(
            waiting=len(scheduler.waiting),
            running=len(scheduler.running),
            reserved=len(reservations),
            queued_prefill_tokens=scheduler.queued_prefill_tokens,
            free_pages=scheduler.blocks.num_free,
            total_pages=scheduler.config.num_blocks,
            stats=stats,
            pool=PoolHealth.of(pool),
        )
