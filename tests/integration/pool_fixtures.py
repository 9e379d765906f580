"""A real ``mooncake_master`` on free loopback ports, a real Redis (the chain index's, the
KV events'), and slabs to move blocks between."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import redis

from kvpool.config import PoolConfig
from kvpool.hashing import Namespace, PrefixHasher
from kvpool.layout import KVLayout
from kvpool.master import MasterConfig
from kvpool.net import free_local_ports
from kvserve.cluster.pool import MasterProcess
from kvserve.cluster.redis import RedisConfig, RedisProcess
from proto.registry import connect
from tests.staging import STAGING

LAYOUT = KVLayout(
    num_layers=3, num_blocks=16, block_tokens=8, kv_heads=2, head_dim=16, dtype="float32"
)
NAMESPACE = Namespace(model="pooltest@0", dtype="float32", block_tokens=8)
HASHER = PrefixHasher(NAMESPACE)
"""The chain of these tests (no secret: the default keys of ``KVPool`` too)."""


@contextmanager
def running_master(log_dir: Path, **overrides: object) -> Iterator[MasterConfig]:
    rpc, meta, metrics = free_local_ports(3)
    cfg = MasterConfig(
        master_port=rpc,
        master_metadata_port=meta,
        master_metrics_port=metrics,
        **overrides,  # type: ignore[arg-type]
    )
    with MasterProcess(cfg, log_dir / "mooncake_master.log"):
        yield cfg


@contextmanager
def running_redis(log_dir: Path) -> Iterator[redis.Redis]:
    """A ``redis-server`` on a free loopback port (its log in ``log_dir``) and a client of
    it; both stopped on exit."""
    (port,) = free_local_ports(1)
    with RedisProcess(RedisConfig(port=port), log_dir / "redis.log") as server:
        client = connect(server.cluster_config, socket_timeout=5)
        try:
            yield client
        finally:
            client.close()


def pool_config(master: MasterConfig, segment_mib: int = 64) -> PoolConfig:
    return PoolConfig(
        pool_master=master.rpc_address,
        pool_metadata_server=master.metadata_url,
        master_metrics_url=master.metrics_url,
        pool_segment_mib=segment_mib,
        pool_local_buffer_mib=16,
        kv_staging=STAGING,
    )


def make_slab(seed: int | None = None) -> np.ndarray:
    """A slab of ``LAYOUT`` (as float32 ``[layers, blocks, span floats]``): zeros or random."""
    shape = (LAYOUT.num_layers, LAYOUT.num_blocks, LAYOUT.span_bytes // 4)
    if seed is None:
        return np.zeros(shape, dtype=np.float32)
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def chain(seed: int, n_blocks: int) -> list[int]:
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, 50000, n_blocks * LAYOUT.block_tokens).tolist()
    return HASHER.chain(tokens, LAYOUT.block_tokens)
