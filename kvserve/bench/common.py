"""What the ``kvserve bench`` verbs share besides the JSON (:func:`kvserve.report.emit`):
timing a piece of work, the headline that sets a measurement against the
baseline measured in the same run, a pool of their own (:func:`scratch_pool`), a whole
deployment on this machine (:func:`started`) and a client's time to the first streamed token
(:func:`stream_ttft`)."""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvserve.report import median

if TYPE_CHECKING:
    from openai import OpenAI

    from kvpool.config import PoolConfig
    from kvpool.master import MasterConfig
    from kvserve.cluster.launch import Cluster
    from workers.config import EngineConfig


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


@contextlib.contextmanager
def started(name: str, engine: EngineConfig, segment_mib: int, **options: Any) -> Iterator[Cluster]:
    """Deployment ``name`` (e.g. ``1p1d``) running on this machine, on free loopback ports,
    its logs in a temporary folder; stopped on exit. ``options``: further
    :class:`~kvserve.cluster.spec.ClusterSpec` fields (router policy, router flags)."""
    from kvpool.config import PoolConfig
    from kvserve.cluster.deployment import parse_deployment
    from kvserve.cluster.launch import Cluster, ClusterSpec

    p, d, m = parse_deployment(name)
    pool = PoolConfig(pool_segment_mib=segment_mib)
    with tempfile.TemporaryDirectory() as tmp:
        spec = ClusterSpec(p, d, m, engine=engine, pool=pool, log_dir=Path(tmp), **options)
        with Cluster(spec.with_free_ports()).start() as cluster:
            yield cluster


def openai_client(url: str) -> OpenAI:
    """The official client of the server at ``url``, without retries (a retry would hide a
    failure inside a timing)."""
    import openai

    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


def stream_ttft(
    client: OpenAI, model: str, prompt: list[int], max_tokens: int
) -> tuple[float, int]:
    """``prompt`` streamed greedily (``max_tokens``): seconds from sending it to the first
    chunk, and its cached prompt tokens from the usage (-1 without). A stream that ends
    without a chunk raises ``RuntimeError`` (no time to report)."""
    begin, first, cached = time.perf_counter(), None, -1
    stream = client.completions.create(
        model=model,
        prompt=prompt,
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    for chunk in stream:
        first = first if first is not None else time.perf_counter() - begin
        if chunk.usage is not None and chunk.usage.prompt_tokens_details is not None:
            cached = chunk.usage.prompt_tokens_details.cached_tokens or 0
    if first is None:
        raise RuntimeError(f"the stream of a {len(prompt)}-token prompt ended without a chunk")
    return first, cached
