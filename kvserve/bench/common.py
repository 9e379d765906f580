"""What the ``kvserve bench`` verbs share besides the JSON (:func:`kvserve.report.emit`):
timing a piece of work, the headline that sets a measurement against the
baseline measured in the same run, and a pool of their own (:func:`scratch_pool`)."""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvserve.report import median

if TYPE_CHECKING:
    from kvpool.config import PoolConfig
    from kvpool.master import MasterConfig


def seconds(work: Callable[[], object]) -> float:
    """Wall seconds one call of ``work`` takes."""
    t0 = time.perf_counter()
    work()
    return time.perf_counter() - t0


def median_seconds(work: Callable[[], object], repeat: int, warmup: bool = True) -> float:
    """Median wall seconds of ``repeat`` calls of ``work`` (after one untimed call)."""
    if warmup:
        work()
    return median([seconds(work) for _ in range(repeat)])


def ratio_headline(
    metric: str,
    value: float | None,
    baseline: float | None,
    target: float | None = None,
    digits: int | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """A headline: ``metric``, ``value`` against the same run's ``baseline``, their
    ``ratio`` (None without both; rounded to ``digits`` when given), ``target`` and
    whatever else the bench adds, in that order."""
    ratio = value / baseline if value is not None and baseline else None
    if ratio is not None and digits is not None:
        ratio = round(ratio, digits)
    return {
        "metric": metric,
        "value": value,
        "baseline": baseline,
        "ratio": ratio,
        "target": target,
        **extra,
    }


@contextlib.contextmanager
def scratch_pool(
    segment_mib: int, log_dir: Path | None = None, name: str = "bench", **master: Any
) -> Iterator[tuple[MasterConfig, PoolConfig]]:
    """A ``mooncake_master`` on free loopback ports for the block (``master``: more
    :class:`~kvpool.master.MasterConfig` fields), and the pool settings that reach it with
    ``segment_mib`` per member; stopped after. Its log is
    ``log_dir/mooncake_master-<name>-<rpc port>.log``, or in a temporary folder removed
    after."""
    from kvpool.config import PoolConfig
    from kvpool.master import MasterConfig
    from kvpool.net import free_local_ports
    from kvserve.cluster.pool import MasterProcess

    with tempfile.TemporaryDirectory() as tmp:
        rpc, meta, metrics = free_local_ports(3)
        config = MasterConfig(
            master_port=rpc, master_metadata_port=meta, master_metrics_port=metrics, **master
        )
        pool = PoolConfig(
            pool_master=config.rpc_address,
            pool_metadata_server=config.metadata_url,
            pool_segment_mib=segment_mib,
        )
        with MasterProcess(config, (log_dir or Path(tmp)) / f"mooncake_master-{name}-{rpc}.log"):
            yield config, pool
