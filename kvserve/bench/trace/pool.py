"""Replay a trace's prefix blocks through a real ``mooncake_master`` (its key space and its
own eviction), without running any model.

Lifecycle of :func:`pool_replay` (one call per capacity, nothing shared between calls):

1. start a ``mooncake_master`` on free loopback ports with the given eviction settings
   (its log goes to ``log_dir``);
2. join it as the one pool member, contributing a segment that holds ``capacity`` blocks
   (:func:`segment_mib`; the pool refuses segments under 16 MiB, so small capacities are
   rounded up: the reported ``pool_capacity_blocks`` says what the master really had);
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
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kvpool.chain_index import ChainIndex
from kvpool.config import EVICTION, PoolConfig
from kvpool.evictor import ChainEvictor, chain_parents
from kvpool.keys import KeySpace, longest_prefix
from kvpool.master import MasterConfig, MasterStats, master_stats
from kvpool.net import free_local_ports
from kvpool.store import MooncakeStore
from kvserve.cluster.pool import MasterProcess
from kvserve.cluster.redis import RedisConfig, RedisProcess
from kvserve.sim.trace.replay import TRACE_NAMESPACE, HitCount, TraceRequest
from proto.registry import connect

MIN_SEGMENT_MIB = 16
"""The smallest segment the pool accepted on these machines."""

FIRST_BACKOFF_S = 0.005


def segment_mib(capacity: int, objects_per_block: int, block_bytes: int, fill: float = 1.0) -> int:
    """MiB of pool segment whose share ``fill`` holds ``capacity`` blocks (at least the
    pool's minimum)."""
    need = int(capacity * objects_per_block * block_bytes / fill + 0.5)
    return max(MIN_SEGMENT_MIB, -(-need // (1 << 20)))


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
    def objects_per_block(self) -> int:
        return 1 + self.layers


@dataclass
class PoolReplay:
    """What one real-pool replay saw."""

    hits: HitCount
    segment_mib: int
    stats: MasterStats
    put_objects: int = 0
    put_retries: int = 0
    put_failed_blocks: int = 0
    seconds: float = 0.0
    chain: dict[str, int] | None = None
    """With chain eviction: its counters (evictions, refusals, the most blocks indexed)."""

    def row(self, settings: PoolReplaySettings) -> dict[str, Any]:
        per_block = settings.objects_per_block * settings.block_bytes
        return {
            "eviction": settings.eviction,
            **self.hits.row(),
            "segment_mib": self.segment_mib,
            "pool_capacity_blocks": self.stats.capacity_bytes // per_block,
            "put_objects": self.put_objects,
            "put_retries": self.put_retries,
            "put_failed_blocks": self.put_failed_blocks,
            "master_keys_end": self.stats.key_count,
            "master_evicted_keys": self.stats.evicted_keys,
            "master_evicted_bytes": self.stats.evicted_bytes,
            "seconds": round(self.seconds, 2),
            **({"chain": self.chain} if self.chain is not None else {}),
        }


class _Writer:
    """Puts blocks' objects from one registered buffer, with retries; counts what it did."""

    def __init__(self, store: MooncakeStore, buf: np.ndarray, settings: PoolReplaySettings):
        self.store = store
        self.buf = buf
        self.settings = settings
        self.objects = 0
        self.retries = 0

    def put(self, keys: list[str]) -> set[str]:
        """Put ``keys`` (at most the buffer's worth); returns the keys that still failed."""
        size = self.settings.block_bytes
        base = self.buf.ctypes.data
        pending = keys
        delay = FIRST_BACKOFF_S
        for attempt in range(self.settings.put_retries + 1):
            if attempt:
                self.retries += 1
                time.sleep(delay)
                delay *= 2
            ptrs = [base + i * size for i in range(len(pending))]
            codes = self.store.put_from(pending, ptrs, [size] * len(pending))
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


@contextmanager
def _chain_evictor(
    settings: PoolReplaySettings,
    capacity: int,
    store: MooncakeStore,
    keys: KeySpace,
    log_dir: Path,
) -> Iterator[ChainEvictor | None]:
    """A chain evictor over a fresh Redis with a budget of ``capacity`` blocks (``None``
    with the master's eviction)."""
    if settings.eviction != "chain":
        yield None
        return
    (port,) = free_local_ports(1)
    per_block = settings.objects_per_block * settings.block_bytes
    with RedisProcess(RedisConfig(port=port), log_dir / f"redis-trace-{capacity}-{port}.log") as r:
        client = connect(r.cluster_config, socket_timeout=30)
        try:
            index = ChainIndex(client, "trace")
            yield ChainEvictor(index, store, keys, per_block, lambda: capacity * per_block)
        finally:
            client.close()


@contextmanager
def replay_member(
    settings: PoolReplaySettings,
    mib: int,
    longest: int,
    log_dir: Path,
    name: str,
    ssd_dir: str = "",
) -> Iterator[tuple[MasterConfig, MooncakeStore, np.ndarray]]:
    """A fresh ``mooncake_master`` on free loopback ports with ``settings``' eviction (and
    offload on, with an ``ssd_dir``), its log ``log_dir/mooncake_master-<name>-<rpc port>.log``,
    and its one member
    contributing ``mib`` MiB (its SSD tier in ``ssd_dir``) with a registered buffer for the
    objects of a ``longest``-block chain: the master's config, the member's store and the
    buffer. On exit the member unregisters and leaves, then the master stops."""
    rpc, meta, metrics = free_local_ports(3)
    cfg = MasterConfig(
        master_port=rpc,
        master_metadata_port=meta,
        master_metrics_port=metrics,
        master_eviction_high_watermark=settings.eviction_high_watermark,
        master_eviction_ratio=settings.eviction_ratio,
        master_enable_offload=bool(ssd_dir),
    )
    with MasterProcess(cfg, log_dir / f"mooncake_master-{name}-{rpc}.log"):
        store = MooncakeStore.connect(
            PoolConfig(
                pool_master=cfg.rpc_address,
                pool_metadata_server=cfg.metadata_url,
                pool_segment_mib=mib,
                pool_local_buffer_mib=16,
                pool_ssd_dir=ssd_dir,
            )
        )
        buf = np.zeros(longest * settings.objects_per_block * settings.block_bytes, np.uint8)
        store.register(buf.ctypes.data, buf.nbytes)
        try:
            yield cfg, store, buf
        finally:
            store.unregister(buf.ctypes.data)
            store.close()


def pool_replay(
    requests: Sequence[TraceRequest],
    chains: Sequence[Sequence[int]],
    capacity: int,
    settings: PoolReplaySettings,
    log_dir: Path,
) -> PoolReplay:
    """Replay ``requests`` (with their :func:`~kvserve.sim.trace.replay.block_chain`) through
    a fresh master whose pool holds about ``capacity`` blocks; see the module docstring."""
    keys = KeySpace.of(TRACE_NAMESPACE, settings.layers)
    fill = settings.evict_at if settings.eviction == "chain" else 1.0
    mib = segment_mib(capacity, settings.objects_per_block, settings.block_bytes, fill)
    longest = max((len(c) for c in chains), default=1)
    hits = HitCount()
    failed = 0
    peak = 0
    with replay_member(settings, mib, longest, log_dir, f"trace-{capacity}") as (cfg, store, buf):
        writer = _Writer(store, buf, settings)
        t0 = time.perf_counter()
        with _chain_evictor(settings, capacity, store, keys, log_dir) as evictor:
            for request, chain in zip(requests, chains, strict=True):
                hit = longest_prefix(store, keys, list(chain))
                hits.add(request, hit)
                todo = list(chain[hit:])
                if evictor is None:
                    failed += len(writer.put_blocks(keys, todo))
                    continue
                evictor.touch(chain[:hit], chain_parents(chain[:hit], None))
                parents = chain_parents(todo, chain[hit - 1] if hit else None)
                admitted = evictor.admit(todo, parents)
                todo = todo[: admitted.index(False) if False in admitted else len(todo)]
                missing = writer.put_blocks(keys, todo)
                evictor.settle(
                    [keys.meta_key(h) for h in todo if h not in missing],
                    [keys.meta_key(h) for h in missing],
                )
                failed += len(missing)
                peak = max(peak, evictor.index.stats().blocks)
            chain_row = _chain_row(evictor, peak, capacity) if evictor else None
        seconds = time.perf_counter() - t0
        stats = master_stats(cfg)
    return PoolReplay(hits, mib, stats, writer.objects, writer.retries, failed, seconds, chain_row)


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
