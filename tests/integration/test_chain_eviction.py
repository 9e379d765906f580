"""Chain-aware eviction (kvpool.evictor) under load: several writers on a real
``mooncake_master`` and a real Redis read and write chains over shared prefixes, each
evicting through the shared index to stay within a budget far below the chains' size."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import redis

from kvpool.chain_index import ChainIndex
from kvpool.pool import KVPool
from kvpool.store import MooncakeStore
from tests.integration.pool_fixtures import (
    HASHER,
    LAYOUT,
    NAMESPACE,
    pool_config,
    running_master,
    running_redis,
)
from tests.staging import pool_memory

pytestmark = pytest.mark.kv_path

WRITERS = 3
ROUNDS = 40
BUDGET_BLOCKS = 24
BRANCHES = 3
DEPTH = 5  # blocks per chain at most: a tree of 3 roots x 3 branches per level


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[MooncakeStore, redis.Redis]]:
    with running_master(tmp_path) as master, running_redis(tmp_path) as client:
        store = MooncakeStore.connect(pool_config(master))
        try:
            yield store, client
        finally:
            store.close()


def tree_chain(rng: np.random.Generator) -> list[int]:
    """A chain of the prefix tree: a root, then a branch at each level."""
    path = [int(rng.integers(3))] + [int(b) for b in rng.integers(BRANCHES, size=DEPTH - 1)]
    tokens = [t for level, b in enumerate(path) for t in [level * 10 + b] * LAYOUT.block_tokens]
    return HASHER.chain(tokens[: LAYOUT.block_tokens * int(rng.integers(1, DEPTH + 1))], 8)


def content(block_hash: int) -> np.ndarray:
    """What a block's page holds: derived from its hash, so any reader can check it."""
    floats = LAYOUT.span_bytes // 4
    rng = np.random.default_rng(block_hash % (1 << 63))
    return rng.standard_normal((LAYOUT.num_layers, floats)).astype(np.float32)


class Worker:
    """One pool member: its slab, its pool (evicting through the shared index when given
    one and a budget)."""

    def __init__(
        self, name: str, store: MooncakeStore, index: ChainIndex | None = None, budget: int = 0
    ) -> None:
        shape = (LAYOUT.num_layers, LAYOUT.num_blocks, LAYOUT.span_bytes // 4)
        self.slab = np.zeros(shape, np.float32)
        self.pool = KVPool(store, NAMESPACE, LAYOUT, pool_memory(self.slab, LAYOUT), name)
        if index is not None:
            self.pool.evict_through(index, lambda: budget)
        self.short_loads = 0
        self.errors: list[BaseException] = []

    def load(self, hashes: list[int]) -> tuple[int, int]:
        """Look the chain up, load what is there and check it: (found, loaded)."""
        found = self.pool.lookup(hashes)
        loaded = self.pool.load(hashes[:found], list(range(found)))
        for page, block_hash in enumerate(hashes[:loaded]):
            assert np.array_equal(self.slab[:, page], content(block_hash))
        return found, loaded

    def round(self, hashes: list[int]) -> None:
        """Load what the pool has of the chain, write the rest."""
        found, loaded = self.load(hashes)
        assert loaded <= found
        self.short_loads += loaded < found  # evicted by another writer in between
        for page, block_hash in enumerate(hashes[loaded:], start=loaded):
            self.slab[:, page] = content(block_hash)
        first_parent = hashes[loaded - 1] if loaded else None
        rest = list(range(loaded, len(hashes)))
        self.pool.save(hashes[loaded:], rest, first_parent)

    def run(self, seed: int) -> None:
        rng = np.random.default_rng(seed)
        try:
            for _ in range(ROUNDS):
                self.round(tree_chain(rng))
        except BaseException as exc:  # reported by the test
            self.errors.append(exc)


def test_eviction_under_load_leaves_no_hole_and_every_lookup_loads(
    cluster: tuple[MooncakeStore, redis.Redis],
) -> None:
    store, client = cluster
    index = ChainIndex(client, "load:pool")
    probe = Worker("probe", store)
    budget = BUDGET_BLOCKS * probe.pool.block_bytes
    workers = [Worker(f"w{i}", store, index, budget) for i in range(WRITERS)]
    threads = [threading.Thread(target=w.run, args=(i,)) for i, w in enumerate(workers)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for worker in workers:
            assert not worker.errors, worker.errors
        stats = [w.pool.stats for w in workers]
        # a read racing an eviction (the objects removed, their memory reused, under the
        # reader) fails verification: a miss, never data handed over (checked above)
        failed_reads = sum(s.checksum_failures + s.short_reads for s in stats)
        assert failed_reads <= sum(w.short_loads for w in workers)
        assert sum(s.forged_blocks for s in stats) == 0
        evictors = [w.pool.evictor for w in workers if w.pool.evictor is not None]
        evicted = sum(e.stats.evicted_blocks for e in evictors)
        assert evicted > 0 and index.stats().evicted == evicted
        assert sum(e.stats.index_errors for e in evictors) == 0

        # quiescent: within the budget (a claim never evicts its own blocks), every indexed
        # block whole in the store, and its parent indexed
        indexed = index.blocks()
        assert index.stats().used_bytes <= budget + DEPTH * probe.pool.block_bytes
        keys = probe.pool.keys
        assert set(store.exists([k for b in indexed for k in (b, *keys.layer_keys(b))])) == {1}
        for block in indexed:
            parent = index.parent_of(block)
            assert parent == "" or parent in indexed, f"{block}: its parent {parent} is gone"
        # every chain of the tree: the pool holds a prefix of it, exactly what the index
        # says, and what lookup finds loads, verified and bit-exact
        rng = np.random.default_rng(99)
        for _ in range(60):
            hashes = tree_chain(rng)
            found, loaded = probe.load(hashes)
            assert loaded == found
            present = [keys.meta_key(h) in indexed for h in hashes]
            assert present == [True] * found + [False] * (len(hashes) - found)
    finally:
        for worker in [*workers, probe]:
            worker.pool.close()
