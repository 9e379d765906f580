"""``kvserve router``: the OpenAI-compatible HTTP API and the conductor."""

from __future__ import annotations

import argparse

from kvpool.config import PoolConfig
from kvserve.settings import config_from_args
from kvserve.verbs import confine_first, start_logging
from proto.registry import ClusterConfig
from router.config import RouterConfig

SETTINGS = (RouterConfig, ClusterConfig, PoolConfig)


def run(args: argparse.Namespace) -> int:
    """Serve until stopped (confined to the pool address first when it looks up the pool)."""
    start_logging(args.log_level)
    router, pool = config_from_args(RouterConfig, args), config_from_args(PoolConfig, args)
    confine_first(pool, router.pool_lookup)
    from router.main import serve

    serve(router, config_from_args(ClusterConfig, args), pool)
    return 0
