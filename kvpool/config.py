"""Configuration of a worker's connection to the shared KV pool (Mooncake Store).

Fields are flags and ``KVSERVE_*`` environment variables through :mod:`kvserve.settings`
(``pool_master`` is ``--pool-master`` / ``KVSERVE_POOL_MASTER``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import PurePath

from kvpool.confine import parse_peers
from kvpool.master import master_metrics_address

PROTOCOLS = ("tcp", "rdma")
STAGING = ("auto", "always", "never")
EVICTION = ("chain", "master")
DEFAULT_METRICS_PORT = 9003
"""``mooncake_master``'s metrics port when nothing says otherwise (its own default)."""
ETCD_SCHEME = "etcd://"
"""How ``pool_master`` names masters in Mooncake's HA mode (the etcd they elect through)."""
P2P_METADATA = "P2PHANDSHAKE"
"""The transfer engine's metadata mode without a metadata service (HA masters' default)."""


def etcd_endpoints(master: str) -> list[tuple[str, int]]:
    """``(host, port)`` of each endpoint of an ``etcd://HOST:PORT[;HOST:PORT...]`` master
    address; ValueError when malformed."""
    endpoints = []
    for part in master.removeprefix(ETCD_SCHEME).split(";"):
        host, _, port = part.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"pool_master {master!r}: want etcd://HOST:PORT[;HOST:PORT...]")
        endpoints.append((host, int(port)))
    return endpoints


STAGING_SETTINGS = ("kv_staging", "kv_staging_mib")
"""The fields of :class:`PoolConfig` a tool that starts its own pool members passes on
(``kvserve chaos``, ``kvserve bench overlap``)."""


@dataclass(frozen=True)
class PoolConfig:
    """How one process joins the pool.

    - ``pool_master``: ``host:port`` of ``mooncake_master``'s RPC service, or, for masters
      in Mooncake's HA mode, ``etcd://HOST:PORT[;HOST:PORT...]``: the etcd cluster where
      they elect their leader (the client follows it there after a failover).
    - ``pool_metadata_server``: transfer-engine metadata service; empty means the master's
      HTTP metadata server (run next to it) at ``http://<master host>:8080/metadata``, or,
      with an ``etcd://`` master, ``P2PHANDSHAKE`` (members exchange their segments'
      descriptions directly: no metadata service to lose).
    - ``pool_protocol``: ``tcp`` (works everywhere) or ``rdma``.
    - ``pool_rdma_devices``: the RDMA NICs for ``rdma``, e.g. ``mlx5_0,mlx5_1``.
    - ``pool_local_hostname``: the address other pool members reach this process at; it
      must not be a loopback address when members run on different hosts.
    - ``pool_confine``: bind Mooncake's own listeners (the transfer engine's ports) to
      ``pool_local_hostname`` only, instead of every interface as Mooncake does
      (:mod:`kvpool.confine`: an ``LD_PRELOAD`` library, built with the system C compiler;
      without one, a warning and every interface).
    - ``pool_peers``: who may connect to those ports (with ``pool_confine``; the library
      closes any other connection as it is accepted): ``auto`` (default) allows local
      processes of this process's own user when ``pool_local_hostname`` is a loopback
      address, and any peer otherwise (with a warning); ``any``; or a comma-separated list
      of ``uid:N`` (a local process of user N) and IPv4 addresses or networks
      (``10.0.0.0/24``). Mooncake's ports serve whoever connects: its data port writes and
      reads any registered memory (the live KV cache, moved in place), its handshake port
      aborts the process on a malformed message (:func:`kvpool.confine.peer_rules`).
    - ``pool_segment_mib``: memory this process contributes to the pool.
    - ``pool_local_buffer_mib``: the client's own transfer buffer.
    - ``pool_ssd_dir``: the pool's second tier, Mooncake's own SSD offload
      (:mod:`kvpool.tiers`): an absolute directory where this member keeps offloaded
      copies of the objects in its segment (created when joining if missing; the
      master needs ``master_enable_offload``). Empty (default): DRAM only.
    - ``pool_transfer_timeout_s``: a transfer between members that makes no progress for
      this long fails (Mooncake's TCP transport: ``MC_TCP_PROGRESS_TIMEOUT_SEC`` and
      ``MC_TCP_STATUS_TIMEOUT_SEC``, whole seconds, at least 1; its own default is 30 s). A
      member that froze or dropped off the network then costs a reader this long, not 30 s:
      the read misses and the blocks are recomputed (the pool is a cache).
    - ``pool_request_ttl_s``: lifetime of request-scoped objects (partial last blocks)
      that nobody collected.
    - ``master_metrics_url``: ``http://host:port/metrics`` of ``mooncake_master`` (its
      capacity, use and evictions: the router's ``/v1/cache/stats``, a worker's eviction
      budget), or several, comma-separated, of masters in HA mode (the leader's is read:
      :func:`kvpool.master.master_stats_at`); empty: the router omits the pool figures, a
      worker reads ``http://<pool_master host>:9003/metrics`` (:attr:`metrics_url`; none
      with an ``etcd://`` master: no eviction budget).
    - ``pool_eviction``: who evicts the pool's prefix blocks. ``chain`` (default): the
      writers, through the chain index in the cluster's Redis (:mod:`kvpool.evictor`):
      least recently used chain tails first, never a block while a block that extends it
      stays, keeping the pool at most ``pool_evict_at`` full; ``master``: only
      ``mooncake_master``, from its high watermark, in lease order. (The master's eviction
      stays on under ``chain`` as the backstop.) A member with ``pool_ssd_dir`` does not
      evict chain-aware: that removes blocks from every tier, and the SSD tier is there to
      keep what DRAM evicts.
    - ``pool_evict_at``: the share of the pool's capacity that chain eviction keeps the
      prefix blocks under; below the master's eviction watermark (0.9 by default), so the
      master never has to evict, with room for request-scoped blocks.
    - ``kv_staging``: how KV moves between the KV cache and the pool
      (:mod:`kvpool.span_io`). ``auto`` (default): in place for a KV cache in host memory,
      through host staging slots for one on a GPU; ``always``: through the staging slots
      for any cache (on the CPU too: every line of the GPU path but the device copies);
      ``never``: in place for any cache (on a GPU, the device memory is registered with
      the pool as it is, for GPUDirect RDMA with Mooncake's CUDA build; digests still go
      through a host slot).
    - ``kv_staging_mib``: host memory of the staging slots (pinned on a GPU machine); a
      transfer larger than a quarter of it goes in several rounds.
    """

    pool_master: str = "127.0.0.1:50051"
    pool_metadata_server: str = ""
    pool_protocol: str = field(default="tcp", metadata={"choices": PROTOCOLS})
    pool_rdma_devices: str = ""
    pool_local_hostname: str = "127.0.0.1"
    pool_confine: bool = True
    pool_peers: str = "auto"
    pool_segment_mib: int = 512
    pool_local_buffer_mib: int = 64
    pool_transfer_timeout_s: float = 5.0
    pool_request_ttl_s: float = 60.0
    master_metrics_url: str = ""
    pool_eviction: str = field(default="chain", metadata={"choices": EVICTION})
    pool_evict_at: float = 0.85
    pool_ssd_dir: str = ""
    kv_staging: str = field(default="auto", metadata={"choices": STAGING})
    kv_staging_mib: int = 64

    def __post_init__(self) -> None:
        if self.pool_protocol not in PROTOCOLS:
            raise ValueError(f"pool_protocol must be one of {PROTOCOLS}")
        if self.pool_protocol == "rdma" and not self.pool_rdma_devices:
            raise ValueError("pool_protocol=rdma needs pool_rdma_devices (e.g. mlx5_0)")
        if self.ha_master:
            etcd_endpoints(self.pool_master)  # raises when malformed
        elif ":" not in self.pool_master:
            raise ValueError(f"pool_master must be host:port, got {self.pool_master!r}")
        parse_peers(self.pool_peers)  # raises when malformed
        if self.pool_segment_mib < 0 or self.pool_local_buffer_mib < 1:
            raise ValueError("pool_segment_mib must be >= 0 and pool_local_buffer_mib >= 1")
        if not self.pool_transfer_timeout_s > 0:
            raise ValueError("pool_transfer_timeout_s must be positive")
        if self.pool_request_ttl_s <= 0:
            raise ValueError("pool_request_ttl_s must be positive")
        for url in filter(None, self.master_metrics_url.split(",")):
            master_metrics_address(url.strip())  # raises when malformed
        if self.pool_eviction not in EVICTION:
            raise ValueError(f"pool_eviction must be one of {EVICTION}, got {self.pool_eviction!r}")
        if not 0 < self.pool_evict_at < 1:
            raise ValueError(f"pool_evict_at must be in (0, 1), got {self.pool_evict_at}")
        ssd = PurePath(self.pool_ssd_dir)
        if self.pool_ssd_dir and (not ssd.is_absolute() or ".." in ssd.parts):
            raise ValueError(
                f"pool_ssd_dir must be an absolute path without '..', got {self.pool_ssd_dir!r}"
            )
        if self.kv_staging not in STAGING:
            raise ValueError(f"kv_staging must be one of {STAGING}, got {self.kv_staging!r}")
        if self.kv_staging_mib < 1:
            raise ValueError(f"kv_staging_mib must be positive, got {self.kv_staging_mib}")

    @property
    def ha_master(self) -> bool:
        """Whether ``pool_master`` names masters in HA mode (``etcd://...``)."""
        return self.pool_master.startswith(ETCD_SCHEME)

    @property
    def metadata_server(self) -> str:
        if self.pool_metadata_server:
            return self.pool_metadata_server
        if self.ha_master:
            return P2P_METADATA
        host = self.pool_master.rsplit(":", 1)[0]
        return f"http://{host}:8080/metadata"

    @property
    def metrics_url(self) -> str:
        """The master's metrics page: ``master_metrics_url``, or the default port on the
        master's host."""
        if self.master_metrics_url or self.ha_master:
            return self.master_metrics_url
        host = self.pool_master.rsplit(":", 1)[0]
        return f"http://{host}:{DEFAULT_METRICS_PORT}/metrics"
