"""The pool's SSD tier (Mooncake's offload) against a real ``mooncake_master``: blocks
written past the DRAM tier's capacity are still loaded, bit-exact, from the SSD copies."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from kvpool.hashing import PrefixHasher
from kvpool.layout import KVLayout
from kvpool.master import MasterConfig
from kvpool.pool import KVPool
from kvpool.store import MooncakeStore
from kvpool.tiers import BUFFER_VARIABLE
from tests.integration.pool_fixtures import NAMESPACE, pool_config, running_master
from tests.staging import pool_memory

pytestmark = pytest.mark.kv_path

BIG = KVLayout(
    num_layers=2, num_blocks=64, block_tokens=8, kv_heads=8, head_dim=512, dtype="float32"
)
"""Spans of 256 KiB: 128 layer objects (32 MiB), twice the DRAM tier."""
SEGMENT_MIB = 16
"""The smallest segment the pool accepts."""
SAVE_DEADLINE_S = 60.0
OFFLOAD_BUFFER = 16 << 20
"""The members' offload staging buffer here: the load's SSD objects (over 16 MiB) must go
in several batches (a batch larger than the buffer fails as a whole)."""


@pytest.fixture
def offload_master(tmp_path: Path) -> Iterator[MasterConfig]:
    with running_master(tmp_path, master_enable_offload=True) as cfg:
        yield cfg


def _slab(seed: int | None) -> np.ndarray:
    shape = (BIG.num_layers, BIG.num_blocks, BIG.span_bytes // 4)
    if seed is None:
        return np.zeros(shape, dtype=np.float32)
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _save_all(pool: KVPool, hashes: list[int], pages: list[int]) -> int:
    """Save a few blocks at a time; a save refused while the SSD offload catches up (a
    full DRAM tier: -200) is tried again, as a writer would on its next request. Returns
    how many saves were refused (in part)."""
    deadline = time.monotonic() + SAVE_DEADLINE_S
    refused = 0
    for start in range(0, len(hashes), 4):
        part, at = hashes[start : start + 4], pages[start : start + 4]
        while sum(pool.absent(part)) and time.monotonic() < deadline:
            pool.save(part, at)
            if sum(pool.absent(part)):
                refused += 1
                time.sleep(0.2)
    return refused


def test_blocks_past_dram_capacity_load_from_ssd(
    offload_master: MasterConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(BUFFER_VARIABLE, str(OFFLOAD_BUFFER))
    ssd_dir = tmp_path / "ssd" / "member"  # missing: made when joining
    base = pool_config(offload_master, segment_mib=SEGMENT_MIB)
    writer_store = MooncakeStore.connect(dataclasses.replace(base, pool_ssd_dir=str(ssd_dir)))
    reader_cfg = dataclasses.replace(base, pool_segment_mib=0, pool_ssd_dir=str(tmp_path / "r"))
    reader_store = MooncakeStore.connect(reader_cfg)  # no DRAM of its own
    source, target = _slab(7), _slab(None)
    writer = KVPool(writer_store, NAMESPACE, BIG, pool_memory(source, BIG), "w")
    reader = KVPool(reader_store, NAMESPACE, BIG, pool_memory(target, BIG), "r")
    try:
        assert writer_store.ssd and ssd_dir.is_dir()
        tokens = np.random.default_rng(7).integers(0, 50000, BIG.num_blocks * 8).tolist()
        hashes = PrefixHasher(NAMESPACE).chain(tokens, 8)
        pages = list(range(BIG.num_blocks))
        refused = _save_all(writer, hashes, pages)
        assert writer.lookup(hashes) == len(hashes)
        # DRAM filled up (puts refused with -200 until the offload caught up): not an outage
        assert refused > 0 and writer_store.outages == 0 and writer_store.available
        assert reader.load(hashes, pages) == len(hashes)
        assert np.array_equal(target, source)
        assert reader.stats.checksum_failures == 0
        stats = reader.stats
        assert stats.ssd_objects > OFFLOAD_BUFFER // 2 // BIG.span_bytes  # several batches
        assert stats.dram_objects > 0
        assert stats.ssd_objects + stats.dram_objects == len(hashes) * BIG.num_layers
        assert any(ssd_dir.rglob("*"))
    finally:
        for pool in (reader, writer):
            pool.close()
            pool.store.close()
