"""The router's pool client against a real mooncake_master: prefix lookups and pool stats.

The workers' pool and the router share a cluster secret: the router computes the workers'
keyed chain from its own secret and algorithm and the record's namespace. A router with
another secret, or a record naming another algorithm, finds nothing (no cross-cluster or
cross-tenant probe).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path

import pytest

from kvpool.config import PoolConfig
from kvpool.hashing import PrefixHasher
from kvpool.keys import KeySpace
from kvpool.pool import KVPool
from kvpool.store import MooncakeStore
from proto.registry import ClusterConfig, WorkerRecord
from router.observability.pool_stats import pool_stats
from router.placement.pool_lookup import PoolLookup, record_chain
from tests.integration.pool_fixtures import (
    LAYOUT,
    NAMESPACE,
    make_slab,
    pool_config,
    running_master,
)
from tests.staging import pool_memory

pytestmark = pytest.mark.kv_path

CLUSTER = ClusterConfig(cluster_secret="s" * 64)
KEYS = CLUSTER.keyring
HASHER = PrefixHasher(NAMESPACE, KEYS.prefix_root)
RECORD = WorkerRecord(
    worker_id="w", address="127.0.0.1:1", role="decode", model="m", model_dir="/nowhere",
    contract=f"{NAMESPACE.key}|{LAYOUT.wire}",
    block_tokens=LAYOUT.block_tokens, num_layers=LAYOUT.num_layers, max_model_len=4096,
    started_at=time.time(), heartbeat_at=time.time(),
)  # fmt: skip


def test_the_router_computes_the_workers_names() -> None:
    hasher, keys = record_chain(RECORD.contract, RECORD.num_layers, KEYS)
    assert hasher == HASHER
    workers = KeySpace.of(NAMESPACE, LAYOUT.num_layers, KEYS.pool_block)
    assert keys.block_keys(7) == workers.block_keys(7)
    assert keys.request_key("r") == workers.request_key("r")
    xxh3 = dataclasses.replace(KEYS, algorithm="xxh3")
    with pytest.raises(ValueError, match="uses sha256"):  # never the record's algorithm
        record_chain(RECORD.contract, RECORD.num_layers, xxh3)
    with pytest.raises(ValueError):
        record_chain("stub", 2, KEYS)


def test_lookup_counts_stored_prefix_tokens(tmp_path: Path) -> None:
    tokens = list(range(100, 100 + 3 * LAYOUT.block_tokens))
    salted = HASHER.chain(tokens, LAYOUT.block_tokens, HASHER.root("tenant-a"))
    with running_master(tmp_path) as master:
        slab = make_slab(1)
        store = MooncakeStore.connect(pool_config(master))
        pool = KVPool(
            store, NAMESPACE, LAYOUT, pool_memory(slab, LAYOUT), "writer", 60.0, KEYS.pool_block
        )
        try:
            assert pool.save(HASHER.chain(tokens, LAYOUT.block_tokens), [0, 1, 2]) == 3
            assert pool.save(salted[:1], [0]) == 1
            asyncio.run(_check_lookup(pool_config(master), tokens))
            stats = asyncio.run(pool_stats(master.metrics_url))
            assert stats["keys"] >= 3 and stats["capacity_bytes"] > 0, stats
        finally:
            pool.close()
            store.close()
    assert "error" in asyncio.run(pool_stats(master.metrics_url))  # master gone


async def _check_lookup(config: PoolConfig, tokens: list[int]) -> None:
    lookup = PoolLookup(config, CLUSTER)
    stranger = PoolLookup(config, ClusterConfig(cluster_secret="t" * 64))
    lookup.start()
    stranger.start()
    try:
        assert await lookup.wait_attempted(30) and lookup.connected
        assert await stranger.wait_attempted(30) and stranger.connected
        bt = LAYOUT.block_tokens
        assert await lookup.pooled_tokens([*tokens, 1, 2, 3], RECORD) == 3 * bt
        assert await lookup.pooled_tokens(tokens[: 2 * bt + 5], RECORD) == 2 * bt
        assert await lookup.pooled_tokens([7, *tokens], RECORD) == 0
        assert await lookup.pooled_tokens(tokens[:5], RECORD) == 0
        assert await lookup.pooled_tokens(tokens, RECORD, "tenant-a") == bt
        assert await lookup.pooled_tokens(tokens, RECORD, "tenant-b") == 0
        assert await stranger.pooled_tokens(tokens, RECORD) == 0  # another secret
        assert await stranger.pooled_tokens(tokens, RECORD, "tenant-a") == 0
    finally:
        await lookup.close()
        await stranger.close()
