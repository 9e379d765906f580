"""Pool-wide figures for ``/v1/cache/stats``, read from ``mooncake_master``'s metrics page."""

from __future__ import annotations

import asyncio
from typing import Any

from kvpool.master import master_stats_at


async def pool_stats(metrics_url: str) -> dict[str, Any]:
    """Capacity, use, keys and evictions; ``{"error": ...}`` when the master cannot say."""
    try:
        stats = await asyncio.to_thread(master_stats_at, metrics_url)
    except Exception as exc:  # any failure to read or parse: report it, do not fail
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {
        "capacity_bytes": stats.capacity_bytes,
        "used_bytes": stats.allocated_bytes,
        "keys": stats.key_count,
        "evicted_keys": stats.evicted_keys,
        "evicted_bytes": stats.evicted_bytes,
    }
