"""The router's pool client against a real mooncake_master: prefix lookups and pool stats."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from kvpool.config import PoolConfig
from kvpool.hashing import hash_chain
from kvpool.keys import KeySpace
from kvpool.pool import KVPool
from kvpool.store import MooncakeStore
from proto.registry import WorkerRecord
from router.pool_lookup import PoolLookup, record_keys
from router.pool_stats import pool_stats
from tests.integration.pool_fixtures import (
    LAYOUT,
    NAMESPACE,
    make_slab,
    pool_config,
    running_master,
)

RECORD = WorkerRecord(
    worker_id="w", address="127.0.0.1:1", role="decode", model="m", model_dir="/nowhere",
    contract=NAMESPACE.key, hash_seed=NAMESPACE.seed, block_tokens=LAYOUT.block_tokens,
    num_layers=LAYOUT.num_layers, max_model_len=4096, started_at=time.time(),
    heartbeat_at=time.time(),
)  # fmt: skip


def test_record_keys_match_the_workers_key_space() -> None:
    workers = KeySpace.of(NAMESPACE, LAYOUT.num_layers)
    assert record_keys(RECORD).block_keys(7) == workers.block_keys(7)


def test_lookup_counts_stored_prefix_tokens(tmp_path: Path) -> None:
    tokens = list(range(100, 100 + 3 * LAYOUT.block_tokens))
    with running_master(tmp_path) as master:
        slab = make_slab(1)
        store = MooncakeStore.connect(pool_config(master))
        pool = KVPool(store, NAMESPACE, LAYOUT, slab.ctypes.data, "writer")
        try:
            hashes = hash_chain(tokens, LAYOUT.block_tokens, NAMESPACE.seed)
            assert pool.save(hashes, [0, 1, 2]) == 3
            asyncio.run(_check_lookup(pool_config(master), tokens))
            stats = asyncio.run(pool_stats(master.metrics_url))
            assert stats["keys"] >= 3 and stats["capacity_bytes"] > 0, stats
        finally:
            pool.close()
            store.close()
    assert "error" in asyncio.run(pool_stats(master.metrics_url))  # master gone


async def _check_lookup(config: PoolConfig, tokens: list[int]) -> None:
    lookup = PoolLookup(config)
    lookup.start()
    try:
        assert await lookup.wait_attempted(30) and lookup.connected
        bt = LAYOUT.block_tokens
        assert await lookup.pooled_tokens([*tokens, 1, 2, 3], RECORD) == 3 * bt
        assert await lookup.pooled_tokens(tokens[: 2 * bt + 5], RECORD) == 2 * bt
        assert await lookup.pooled_tokens([7, *tokens], RECORD) == 0
        assert await lookup.pooled_tokens(tokens[:5], RECORD) == 0
    finally:
        await lookup.close()
