"""The KV pool against a real mooncake_master (fresh one per test, free loopback ports)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from kvpool.master import MasterConfig, master_stats
from kvpool.pool import KVPool
from kvpool.store import MooncakeStore, PoolUnavailableError
from tests.integration.pool_fixtures import (
    LAYOUT,
    NAMESPACE,
    chain,
    make_slab,
    pool_config,
    running_master,
)
from tests.staging import pool_memory

pytestmark = pytest.mark.kv_path


@pytest.fixture
def master(tmp_path: Path) -> Iterator[MasterConfig]:
    with running_master(tmp_path) as cfg:
        yield cfg
        close_opened()


OPENED: list[KVPool] = []


def close_opened() -> None:
    """Every pool client a test opened leaves the pool (before its master stops)."""
    while OPENED:
        pool = OPENED.pop()
        pool.close()
        pool.store.close()


def open_pool(master: MasterConfig, slab: np.ndarray, writer: str) -> KVPool:
    store = MooncakeStore.connect(pool_config(master))
    pool = KVPool(store, NAMESPACE, LAYOUT, pool_memory(slab, LAYOUT), writer)
    OPENED.append(pool)
    return pool


def test_blocks_cross_processes_bit_exact(master: MasterConfig) -> None:
    writer = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.integration.pool_writer",
            master.rpc_address,
            master.metadata_url,
            "5",
            "4",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert writer.stdout is not None and writer.stdout.readline().strip() == "4"
        slab = make_slab()
        pool = open_pool(master, slab, "reader")
        hashes = chain(5, 4)
        assert pool.lookup(hashes) == 4
        pages = [9, 3, 12, 0]  # any pages of the reader's own cache
        assert pool.load(hashes, pages) == 4
        expected = make_slab(5)
        for i, page in enumerate(pages):
            assert np.array_equal(slab[:, page], expected[:, i])
        assert pool.stats.hit_blocks == 4 and pool.stats.checksum_failures == 0
    finally:
        if writer.stdin:
            writer.stdin.close()
        writer.wait(30)


def test_longest_prefix_lookup(master: MasterConfig) -> None:
    slab = make_slab(1)
    pool = open_pool(master, slab, "w")
    hashes = chain(1, 6)
    assert pool.lookup(hashes) == 0
    assert pool.save(hashes[:3], [0, 1, 2]) == 3
    assert pool.lookup(hashes) == 3
    assert pool.lookup(hashes[:2]) == 2
    assert pool.lookup(chain(2, 6)) == 0  # another prefix
    assert pool.save(hashes[:3], [0, 1, 2]) == 0  # already present: nothing rewritten


def test_namespaces_do_not_see_each_other(master: MasterConfig) -> None:
    from kvpool.hashing import Namespace

    slab = make_slab(1)
    pool = open_pool(master, slab, "w")
    hashes = chain(1, 2)
    pool.save(hashes, [0, 1])
    other_ns = Namespace(model="another@1", dtype="float32", block_tokens=8)
    other = KVPool(pool.store, other_ns, LAYOUT, pool_memory(make_slab(), LAYOUT), "x")
    assert other.lookup(hashes) == 0


def corrupt_layer(pool: KVPool, block_hash: int, layer: int) -> None:
    junk = np.full(LAYOUT.span_bytes // 4, 7.0, dtype=np.float32)
    pool.store.register(junk.ctypes.data, junk.nbytes)
    key = pool.keys.layer_keys(pool.keys.meta_key(block_hash))[layer]
    assert pool.store.upsert_from([key], [junk.ctypes.data], [junk.nbytes]) == [0]


def test_corrupted_or_missing_layers_are_misses_and_healed(master: MasterConfig) -> None:
    source = make_slab(3)
    pool = open_pool(master, source, "w")
    hashes = chain(3, 4)
    assert pool.save(hashes, [0, 1, 2, 3]) == 4
    corrupt_layer(pool, hashes[2], layer=1)
    pool.store.remove([pool.keys.layer_keys(pool.keys.meta_key(hashes[3]))[0]])
    target = make_slab()
    reader = open_pool(master, target, "r")
    assert reader.lookup(hashes) == 3  # block 3 lacks a layer; block 2 looks complete...
    assert reader.load(hashes, [4, 5, 6, 7]) == 2  # ...but fails its checksum
    assert reader.stats.checksum_failures == 1
    assert reader.stats.miss_blocks == 2
    assert np.array_equal(target[:, 4:6], source[:, 0:2])
    assert reader.lookup(hashes) == 2  # the bad block was removed ...
    # ... so it is written anew, and so is block 3 (whose leftovers are cleared first).
    assert pool.save(hashes, [0, 1, 2, 3]) == 2
    assert reader.load(hashes, [4, 5, 6, 7]) == 4
    assert np.array_equal(target[:, 4:8], source[:, 0:4])


def test_meta_of_another_layout_is_refused(master: MasterConfig) -> None:
    from kvpool.layout import KVLayout

    slab = make_slab(4)
    pool = open_pool(master, slab, "w")
    hashes = chain(4, 1)
    pool.save(hashes, [0])
    wide = KVLayout(
        num_layers=3, num_blocks=16, block_tokens=8, kv_heads=4, head_dim=8, dtype="float32"
    )
    reader = KVPool(pool.store, NAMESPACE, wide, pool_memory(make_slab(), wide), "r")
    assert reader.load(hashes, [0]) == 0
    assert reader.stats.bad_meta == 1


def test_master_metrics_report_capacity_and_use(master: MasterConfig) -> None:

    pool = open_pool(master, make_slab(6), "w")
    pool.save(chain(6, 2), [0, 1])
    stats = master_stats(master)
    assert stats.capacity_bytes == 64 << 20
    assert stats.key_count == 8  # 2 blocks x (3 layers + 1 meta)
    assert stats.allocated_bytes >= 2 * 3 * LAYOUT.span_bytes
    assert stats.evicted_keys == 0


def test_unreachable_master_is_a_clear_error() -> None:
    from kvpool.config import PoolConfig
    from kvpool.net import free_local_ports

    (port,) = free_local_ports(1)
    cfg = PoolConfig(
        pool_master=f"127.0.0.1:{port}", pool_metadata_server=f"http://127.0.0.1:{port}/metadata"
    )
    with pytest.raises(PoolUnavailableError, match="is mooncake_master running"):
        MooncakeStore.connect(cfg)


def test_kvserve_pool_command_serves_and_stops(tmp_path: Path) -> None:
    import os
    import signal
    import time

    from kvpool.net import free_local_ports

    rpc, meta, metrics = free_local_ports(3)
    env = {**os.environ, "KVSERVE_MASTER_PORT": str(rpc)}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kvserve",
            "pool",
            "--master-metadata-port",
            str(meta),
            "--master-metrics-port",
            str(metrics),
        ],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        line = ""
        deadline = time.monotonic() + 60
        while "mooncake_master up" not in line and time.monotonic() < deadline:
            line = proc.stderr.readline()
        assert f"rpc 127.0.0.1:{rpc}" in line
        cfg = MasterConfig(master_port=rpc, master_metadata_port=meta, master_metrics_port=metrics)
        store = MooncakeStore.connect(pool_config(cfg))
        assert store.healthy()
        store.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0


def test_partial_block_is_taken_once_and_expires(master: MasterConfig) -> None:
    import time

    source = make_slab(8)
    pool = open_pool(master, source, "w")
    target = make_slab()
    reader = open_pool(master, target, "r")
    assert pool.partials.put("req-1", page=2, num_tokens=5)
    assert reader.partials.take("req-1", page=9) == 5
    assert np.array_equal(target[:, 9], source[:, 2])
    assert reader.partials.take("req-1", page=9) is None  # taken: deleted from the pool
    # Uncollected: the writer's sweep removes it once the lease ran out.
    assert pool.partials.put("req-2", page=3, num_tokens=8)
    key = pool.keys.request_key("req-2")
    assert pool.partials.sweep() == 0
    assert pool.store.exists([key]) == [1]
    assert pool.partials.sweep(now=time.time() + pool.partials.ttl_s + 1) == 1
    assert pool.store.exists([key, *pool.keys.layer_keys(key)]) == [0] * 4
    assert pool.stats.expired_requests == 1


def test_expired_partial_block_is_a_miss(master: MasterConfig) -> None:
    pool = open_pool(master, make_slab(9), "w")
    pool.partials.ttl_s = 0.05
    assert pool.partials.put("req-3", page=0, num_tokens=1)
    import time

    time.sleep(0.1)
    assert open_pool(master, make_slab(), "r").partials.take("req-3", page=0) is None


def test_eviction_under_small_capacity_keeps_lookups_truthful(tmp_path: Path) -> None:
    import time

    from kvpool.layout import KVLayout

    # 16 MiB of pool memory; a block is 3 layers x 128 KiB: about 40 blocks fit.
    big = KVLayout(
        num_layers=3, num_blocks=8, block_tokens=64, kv_heads=4, head_dim=64, dtype="float32"
    )
    source = np.random.default_rng(10).standard_normal(big.slab_bytes // 4).astype(np.float32)
    with running_master(
        tmp_path, master_eviction_high_watermark=0.7, master_eviction_ratio=0.2
    ) as cfg:
        store = MooncakeStore.connect(pool_config(cfg, segment_mib=16))
        pool = KVPool(store, NAMESPACE, big, pool_memory(source, big), "w")
        target = np.zeros_like(source)
        reader = KVPool(store, NAMESPACE, big, pool_memory(target, big), "r")
        try:
            chains = [chain(100 + i, 8) for i in range(12)]  # 96 blocks: over twice the capacity
            for hashes in chains:  # the master evicts in the background: retry a while
                deadline = time.monotonic() + 20
                while pool.lookup(hashes) < 8 and time.monotonic() < deadline:
                    pool.save(hashes, list(range(8)))
                    time.sleep(0.05)
            stats = master_stats(cfg)
            assert stats.allocated_bytes <= stats.capacity_bytes == 16 << 20
            assert stats.evicted_keys > 0
            found = [reader.lookup(h) for h in chains]
            assert found[0] == 0 and found == sorted(found)  # the oldest went first
            assert found[-1] == 8  # the newest chain is whole
            assert sum(found) < 8 * len(chains)  # older blocks were evicted
            for hashes, n in zip(chains, found, strict=True):
                assert reader.load(hashes[:n], list(range(n))) == n  # lookups never overclaim
                pages = (big.num_layers, big.num_blocks, -1)
                assert np.array_equal(target.reshape(pages)[:, :n], source.reshape(pages)[:, :n])
        finally:
            reader.close()
            pool.close()
            store.close()


def test_router_style_lookup_needs_no_kv_memory(master: MasterConfig) -> None:
    from kvpool.config import PoolConfig
    from kvpool.keys import KeySpace, longest_prefix

    pool = open_pool(master, make_slab(11), "w")
    hashes = chain(11, 5)
    pool.save(hashes[:3], [0, 1, 2])
    # A member that contributes no memory and registers none, as the router will be.
    router = MooncakeStore.connect(
        PoolConfig(
            pool_master=master.rpc_address,
            pool_metadata_server=master.metadata_url,
            pool_segment_mib=0,
            pool_local_buffer_mib=16,
        )
    )
    try:
        assert longest_prefix(router, KeySpace.of(NAMESPACE, LAYOUT.num_layers), hashes) == 3
    finally:
        router.close()
