"""``kvserve worker``: serve one engine over gRPC (role prefill, decode or mixed)."""

from __future__ import annotations

import argparse

from kvpool.config import PoolConfig
from kvserve.settings import config_from_args
from kvserve.verbs import confine_first, start_logging
from proto.registry import ClusterConfig
from workers.config import EngineConfig, WorkerConfig

SETTINGS = (WorkerConfig, EngineConfig, PoolConfig, ClusterConfig)


def run(args: argparse.Namespace) -> int:
    """Serve until stopped (confined to the pool address first when it joins the pool)."""
    start_logging(args.log_level)
    worker, pool = config_from_args(WorkerConfig, args), config_from_args(PoolConfig, args)
    confine_first(pool.pool_confine, pool.pool_local_hostname, worker.use_pool)
    from workers.server import serve

    return serve(
        worker,
        config_from_args(EngineConfig, args),
        pool,
        config_from_args(ClusterConfig, args),
    )
