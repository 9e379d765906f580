"""Replay a trace's prefix blocks through a real ``mooncake_master`` (its key space, its own
eviction or kvserve's), without running any model.

Lifecycle of :func:`pool_replay` (one call per replay, nothing shared between calls):

1. start a ``mooncake_master`` on free loopback ports with the given eviction settings
   (its log goes to ``log_dir``);
2. join it as the one pool member, contributing a segment that holds ``capacity`` blocks
   (the pool refuses segments under 16 MiB, so small capacities are rounded up: the
   reported ``pool_capacity_blocks`` says what the master really had);
3. per request, in trace order: ``kvpool.keys.longest_prefix`` over its block chain (one
   batched existence call; the master also refreshes the lease of every object it finds,
   which is what makes its eviction approximately LRU) gives the hits; then every block
   after the hits is put (``batch_put_from`` out of one registered buffer): its layer
   objects first, then its meta object, as ``kvpool.pool`` commits. A block is
   ``1 + layers`` objects of ``block_bytes`` each, holding no real KV (only existence
   matters here). Puts of objects that exist succeed without overwriting. Eviction is
   asynchronous, so a put may fail for want of space (code -200) until the master has
   evicted: failed objects are retried with a doubling backoff, and the blocks still
   missing after ``put_retries`` retries are counted as ``put_failed_blocks``;
4. read the master's counters (``kvpool.master.master_stats``), leave the pool, stop the
   master.

With ``eviction="chain"`` the replay evicts as kvserve's writers do
(:mod:`kvpool.evictor`): a Redis runs next to the master for the chain index; each
request's hits refresh their blocks in it, and its new blocks are claimed there before
they are put, which evicts the least recently used chain tails beyond a budget of exactly
``capacity`` blocks. The segment is sized so that budget is ``evict_at`` of it (the
master's own eviction, from its higher watermark, never has to start).

The SSD replays of :mod:`.ssd` run the same way, with reads between a request's lookup and
its puts, and an SSD tier when asked for.
"""

from __future__ import annotations

import contextlib
import dataclasses
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kvpool.chain_index import ChainIndex
from kvpool.config import EVICTION
from kvpool.evictor import ChainEvictor, chain_parents
from kvpool.keys import KeySpace, longest_prefix
from kvpool.master import MasterConfig, MasterStats, master_stats
from kvpool.net import free_local_ports
from kvpool.store import MooncakeStore
from kvserve.bench.common import scratch_pool
from kvserve.cluster.redis import RedisConfig, RedisProcess
from kvserve.sim.trace.replay import TRACE_NAMESPACE, HitCount, TraceRequest
from proto.registry import connect

MIN_SEGMENT_MIB = 16
"""The smallest segment the pool accepted on these machines."""
FIRST_BACKOFF_S = 0.005
Read = Callable[[MooncakeStore, int, int, KeySpace, Sequence[int]], int]
"""An SSD replay's read-back (:mod:`.ssd`): given the store, the registered buffer's address,
the object size, the key space and the blocks the lookup found, the leading blocks read."""


@dataclass(frozen=True)
class PoolReplaySettings:
    """How the real-pool replay runs (every field goes into the benchmark's conditions)."""

    block_bytes: int = 65536
    layers: int = 0
    eviction_high_watermark: float = MasterConfig.master_eviction_high_watermark
    eviction_ratio: float = MasterConfig.master_eviction_ratio
    put_retries: int = 5
    eviction: str = "master"
    evict_at: float = 0.85

    def __post_init__(self) -> None:
        if self.block_bytes < 1 or self.layers < 0 or self.put_retries < 0:
            raise ValueError("block_bytes must be positive, layers and put_retries >= 0")
        if self.eviction not in EVICTION:
            raise ValueError(f"eviction must be one of {EVICTION}, got {self.eviction!r}")
        if not 0 < self.evict_at < self.eviction_high_watermark:
            raise ValueError("evict_at must be in (0, eviction_high_watermark)")
        MasterConfig(
            master_eviction_high_watermark=self.eviction_high_watermark,
            master_eviction_ratio=self.eviction_ratio,
        )  # validates the eviction settings with the master's own messages

    @property
    def per_block(self) -> int:
        """Bytes of all the objects of a block (``1 + layers`` of them)."""
        return (1 + self.layers) * self.block_bytes


@dataclass
class PoolReplay:
    """What one real-pool replay saw (``lookup_hit_blocks``: the blocks its lookups found,
    which an SSD replay of :mod:`.ssd` reads back)."""

    hits: HitCount
    segment_mib: int
    stats: MasterStats
    put_objects: int = 0
    put_retries: int = 0
    put_failed_blocks: int = 0
    seconds: float = 0.0
    chain: dict[str, int] | None = None
    """With chain eviction: its counters (evictions, refusals, the most blocks indexed)."""
    lookup_hit_blocks: int = 0

    def row(self, settings: PoolReplaySettings) -> dict[str, Any]:
        return {
            "eviction": settings.eviction,
            **self.hits.row(),
            "segment_mib": self.segment_mib,
            "pool_capacity_blocks": self.stats.capacity_bytes // settings.per_block,
            "put_objects": self.put_objects,
            "put_retries": self.put_retries,
            "put_failed_blocks": self.put_failed_blocks,
            "master_keys_end": self.stats.key_count,
            "master_evicted_keys": self.stats.evicted_keys,
            "master_evicted_bytes": self.stats.evicted_bytes,
            "seconds": round(self.seconds, 2),
            **({"chain": self.chain} if self.chain is not None else {}),
        }


class _Member:
    """The member's puts of blocks' objects out of one registered buffer (at ``base``), with
    retries; counts what it did."""

    def __init__(self, store: MooncakeStore, buf: np.ndarray, settings: PoolReplaySettings):
        self.store, self.base, self.settings = store, buf.ctypes.data, settings
        self.size = settings.block_bytes
        self.objects = 0
        self.retries = 0

    def put(self, keys: list[str]) -> set[str]:
        """Put ``keys`` (at most the buffer's worth); returns the keys that still failed."""
        pending = keys
        delay = FIRST_BACKOFF_S
        for attempt in range(self.settings.put_retries + 1):
            if attempt:
                self.retries += 1
                time.sleep(delay)
                delay *= 2
            ptrs = [self.base + i * self.size for i in range(len(pending))]
            codes = self.store.put_from(pending, ptrs, [self.size] * len(pending))
            self.objects += sum(1 for c in codes if c == 0)
            pending = [k for k, c in zip(pending, codes, strict=True) if c != 0]
            if not pending:
                break
        return set(pending)

    def put_blocks(self, keys: KeySpace, hashes: Sequence[int]) -> list[int]:
        """Layers first, then the meta of each block whose layers all landed; returns the
        blocks still not present."""
        metas = [keys.meta_key(h) for h in hashes]
        layer_failed = self.put([k for m in metas for k in keys.layer_keys(m)])
        whole = [m for m in metas if not any(k in layer_failed for k in keys.layer_keys(m))]
        present = set(whole) - self.put(whole)
        return [h for h, m in zip(hashes, metas, strict=True) if m not in present]


@contextlib.contextmanager
def _chain_evictor(
    settings: PoolReplaySettings, capacity: int, store: MooncakeStore, keys: KeySpace, logs: Path
) -> Iterator[ChainEvictor | None]:
    """A chain evictor over a fresh Redis with a budget of ``capacity`` blocks (``None``
    with the master's eviction)."""
    if settings.eviction != "chain":
        yield None
        return
    (port,) = free_local_ports(1)
    per_block = settings.per_block
    with RedisProcess(RedisConfig(port=port), logs / f"redis-trace-{capacity}-{port}.log") as r:
        client = connect(r.cluster_config, socket_timeout=30)
        try:
            index = ChainIndex(client, "trace")
            yield ChainEvictor(index, store, keys, per_block, lambda: capacity * per_block)
        finally:
            client.close()


@contextlib.contextmanager
def _member(
    settings: PoolReplaySettings, mib: int, longest: int, log_dir: Path, name: str, ssd: bool
) -> Iterator[tuple[MasterConfig, _Member]]:
    """Steps 1, 2 and 4 of the module docstring: the master (its log
    ``log_dir/mooncake_master-<name>-<rpc port>.log``) and its member of ``mib`` MiB, with a
    registered buffer for the objects of a ``longest``-block chain; with ``ssd``, offload on
    and the member's SSD tier in a temporary folder, removed afterwards."""
    options = {
        "master_eviction_high_watermark": settings.eviction_high_watermark,
        "master_eviction_ratio": settings.eviction_ratio,
        "master_enable_offload": ssd,
    }
    with (
        tempfile.TemporaryDirectory(prefix="kvserve-ssd-") as folder,
        scratch_pool(mib, log_dir, name, **options) as (cfg, pool),
    ):
        ssd_dir = folder if ssd else ""
        local = dataclasses.replace(pool, pool_local_buffer_mib=16, pool_ssd_dir=ssd_dir)
        store = MooncakeStore.connect(local)
        buf = np.zeros(longest * settings.per_block, np.uint8)
        store.register(buf.ctypes.data, buf.nbytes)
        try:
            yield cfg, _Member(store, buf, settings)
        finally:
            store.unregister(buf.ctypes.data)
            store.close()


def pool_replay(
    requests: Sequence[TraceRequest],
    chains: Sequence[Sequence[int]],
    capacity: int,
    settings: PoolReplaySettings,
    log_dir: Path,
    read: Read | None = None,
    ssd: bool = False,
) -> PoolReplay:
    """Replay ``requests`` (with their :func:`~kvserve.sim.trace.replay.block_chain`) through
    a fresh master whose pool holds about ``capacity`` blocks (module docstring); with
    ``read``, an SSD replay of :mod:`.ssd` whose hits are the blocks it reads back, with an
    SSD tier if ``ssd``."""
    keys = KeySpace.of(TRACE_NAMESPACE, settings.layers)
    fill = settings.evict_at if settings.eviction == "chain" else 1.0
    need = int(capacity * settings.per_block / fill + 0.5)  # the segment: at least the minimum
    mib = max(MIN_SEGMENT_MIB, -(-need // (1 << 20)))
    longest = max((len(c) for c in chains), default=1)
    name = f"trace-{capacity}" if read is None else f"{'ssd' if ssd else 'dram'}-{capacity}"
    hits, found, failed, peak = HitCount(), 0, 0, 0
    with _member(settings, mib, longest, log_dir, name, ssd) as (cfg, member):
        t0 = time.perf_counter()
        with _chain_evictor(settings, capacity, member.store, keys, log_dir) as evictor:
            for request, chain in zip(requests, chains, strict=True):
                hit = longest_prefix(member.store, keys, list(chain))
                found += hit
                if read is not None:
                    hit = read(member.store, member.base, member.size, keys, chain[:hit])
                hits.add(request, hit)
                todo = list(chain[hit:])
                if evictor is None:
                    failed += len(member.put_blocks(keys, todo))
                    continue
                evictor.touch(chain[:hit], chain_parents(chain[:hit], None))
                parents = chain_parents(todo, chain[hit - 1] if hit else None)
                admitted = evictor.admit(todo, parents)
                todo = todo[: admitted.index(False) if False in admitted else len(todo)]
                missing = member.put_blocks(keys, todo)
                evictor.settle(
                    [keys.meta_key(h) for h in todo if h not in missing],
                    [keys.meta_key(h) for h in missing],
                )
                failed += len(missing)
                peak = max(peak, evictor.index.stats().blocks)
            chain_row = _chain_row(evictor, peak, capacity) if evictor else None
        seconds = time.perf_counter() - t0
        stats = master_stats(cfg)
    counts = (member.objects, member.retries, failed, seconds)
    return PoolReplay(hits, mib, stats, *counts, chain_row, found)


def _chain_row(evictor: ChainEvictor, peak: int, capacity: int) -> dict[str, int]:
    index = evictor.index.stats()
    return {
        "budget_blocks": capacity,
        "peak_indexed_blocks": peak,
        "indexed_blocks_end": index.blocks,
        "evicted_blocks": evictor.stats.evicted_blocks,
        "refused_blocks": evictor.stats.refused_blocks,
        "orphans_removed": evictor.stats.orphans_removed,
        "forgotten_blocks": index.forgotten,
    }
