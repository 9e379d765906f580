"""The KV pool's master as its clients see it: :class:`MasterConfig` (where the pool's two
services listen and how the master evicts) and :func:`master_stats` (its metrics page as
:class:`MasterStats`).

The services themselves are run by :mod:`kvserve.cluster.pool` (``mooncake_master`` and
``mooncake_http_metadata_server``, their argv and readiness); the TCP helpers are in
:mod:`kvpool.net`.
"""

from __future__ import annotations

import urllib.request
from dataclasses import dataclass
from urllib.parse import urlsplit


@dataclass(frozen=True)
class MasterConfig:
    """Flags of ``kvserve pool`` (env ``KVSERVE_MASTER_*``).

    - ``master_host``: address every service binds to (loopback unless asked otherwise).
    - ``master_port`` / ``master_metadata_port`` / ``master_metrics_port``: the master's RPC,
      the HTTP metadata server (``mooncake_http_metadata_server``) and the master's
      metrics/admin server.
    - ``master_client_ttl_s``: seconds before a silent member's segment is unmounted.
    - ``master_eviction_high_watermark`` / ``master_eviction_ratio``: start evicting when
      this share of pool memory is used; evict this share of objects each time.
    - ``master_enable_offload``: let members with an SSD tier (``pool_ssd_dir``) offload
      objects to it and serve misses from it (Mooncake's ``--enable_offload``; off: DRAM
      only, whatever the members say).
    - ``master_offload_on_evict``: offload an object only when DRAM evicts it (default: as
      soon as it is written, so DRAM and SSD both hold it until DRAM evicts it).
    - ``master_promotion_on_hit``: copy objects read from SSD back into DRAM.
    - ``master_etcd_endpoints``: Mooncake's HA mode: ``HOST:PORT[;HOST:PORT...]`` of the
      etcd cluster where several masters elect their leader (each then binds and advertises
      ``master_host``, and no metadata server runs: members exchange segment descriptions
      directly); empty (default): one master with its HTTP metadata server.
    """

    master_host: str = "127.0.0.1"
    master_port: int = 50051
    master_metadata_port: int = 8080
    master_metrics_port: int = 9003
    master_client_ttl_s: int = 10
    master_eviction_high_watermark: float = 0.9
    master_eviction_ratio: float = 0.05
    master_enable_offload: bool = False
    master_offload_on_evict: bool = False
    master_promotion_on_hit: bool = False
    master_etcd_endpoints: str = ""

    def __post_init__(self) -> None:
        if not 0 < self.master_eviction_high_watermark <= 1:
            raise ValueError("master_eviction_high_watermark must be in (0, 1]")
        if not 0 < self.master_eviction_ratio <= 1:
            raise ValueError("master_eviction_ratio must be in (0, 1]")
        if self.master_client_ttl_s < 1:
            raise ValueError("master_client_ttl_s must be at least 1")
        if (self.master_offload_on_evict or self.master_promotion_on_hit) and not (
            self.master_enable_offload
        ):
            raise ValueError(
                "master_offload_on_evict and master_promotion_on_hit need master_enable_offload"
            )

    @property
    def rpc_address(self) -> str:
        return f"{self.master_host}:{self.master_port}"

    @property
    def metadata_url(self) -> str:
        return f"http://{self.master_host}:{self.master_metadata_port}/metadata"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.master_host}:{self.master_metrics_port}/metrics"


def master_metrics_address(url: str) -> tuple[str, int]:
    """``(host, port)`` of a ``http://host:port[/metrics]`` URL; raises ValueError else."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname or parts.path not in ("", "/", "/metrics"):
        raise ValueError(
            f"master_metrics_url must look like http://127.0.0.1:9003/metrics, got {url!r}"
        )
    try:
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"master_metrics_url has a bad port: {url!r}") from exc
    if port is None:
        raise ValueError(f"master_metrics_url needs an explicit port, got {url!r}")
    return parts.hostname, port


def read_metrics(cfg: MasterConfig, timeout: float = 2.0) -> str:
    """The master's metrics page (Prometheus text)."""
    with urllib.request.urlopen(cfg.metrics_url, timeout=timeout) as resp:
        return str(resp.read().decode())


@dataclass(frozen=True)
class MasterStats:
    """Pool-wide figures from the master: memory, objects, evictions."""

    capacity_bytes: int
    allocated_bytes: int
    key_count: int
    evicted_keys: int
    evicted_bytes: int


def master_stats_at(url: str, timeout: float = 2.0) -> MasterStats:
    """:func:`master_stats` of the master whose metrics page is ``url``; of several
    (comma-separated: masters in HA mode), the one that reports the most capacity, which is
    the leader's (a standby's reports none; a master that does not answer is skipped, and
    when none answers the last error is raised)."""
    found: list[MasterStats] = []
    error: Exception | None = None
    for one in url.split(","):
        host, port = master_metrics_address(one.strip())
        try:
            cfg = MasterConfig(master_host=host, master_metrics_port=port)
            found.append(master_stats(cfg, timeout))
        except OSError as exc:
            error = exc
    if not found:
        assert error is not None
        raise error
    return max(found, key=lambda stats: stats.capacity_bytes)


def master_stats(cfg: MasterConfig, timeout: float = 2.0) -> MasterStats:
    """Parse the master's metrics page into :class:`MasterStats`."""
    from prometheus_client.parser import text_string_to_metric_families

    values: dict[str, float] = {}
    for family in text_string_to_metric_families(read_metrics(cfg, timeout)):
        for sample in family.samples:
            if not sample.labels:  # by family name: the parser renames counter samples
                values[family.name] = sample.value

    def get(name: str) -> int:
        return int(values.get(name, 0))

    return MasterStats(
        capacity_bytes=get("master_total_capacity_bytes"),
        allocated_bytes=get("master_allocated_bytes"),
        key_count=get("master_key_count"),
        evicted_keys=get("master_evicted_key_count"),
        evicted_bytes=get("master_evicted_size_bytes"),
    )
