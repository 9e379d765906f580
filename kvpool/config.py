"""Configuration of a worker's connection to the shared KV pool (Mooncake Store).

Fields are flags and ``KVSERVE_*`` environment variables through :mod:`kvserve.settings`
(``pool_master`` is ``--pool-master`` / ``KVSERVE_POOL_MASTER``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import PurePath

PROTOCOLS = ("tcp", "rdma")
STAGING = ("auto", "always", "never")
STAGING_SETTINGS = ("kv_staging", "kv_staging_mib")
"""The fields of :class:`PoolConfig` a tool that starts its own pool members passes on
(``kvserve chaos``, ``kvserve bench overlap``)."""


@dataclass(frozen=True)
class PoolConfig:
    """How one process joins the pool.

    - ``pool_master``: ``host:port`` of ``mooncake_master``'s RPC service.
    - ``pool_metadata_server``: transfer-engine metadata service; empty means the master's
      HTTP metadata server (run next to it) at ``http://<master host>:8080/metadata``.
    - ``pool_protocol``: ``tcp`` (works everywhere) or ``rdma``.
    - ``pool_rdma_devices``: the RDMA NICs for ``rdma``, e.g. ``mlx5_0,mlx5_1``.
    - ``pool_local_hostname``: the address other pool members reach this process at; it
      must not be a loopback address when members run on different hosts.
    - ``pool_confine``: bind Mooncake's own listeners (the transfer engine's ports) to
      ``pool_local_hostname`` only, instead of every interface as Mooncake does
      (:mod:`kvpool.confine`: an ``LD_PRELOAD`` library, built with the system C compiler;
      without one, a warning and every interface).
    - ``pool_segment_mib``: memory this process contributes to the pool.
    - ``pool_local_buffer_mib``: the client's own transfer buffer.
    - ``pool_ssd_dir``: the pool's second tier, Mooncake's own SSD offload
      (:mod:`kvpool.tiers`): an absolute directory where this member keeps offloaded
      copies of the objects in its segment (created when joining if missing; the
      master needs ``master_enable_offload``). Empty (default): DRAM only.
    - ``pool_request_ttl_s``: lifetime of request-scoped objects (partial last blocks)
      that nobody collected.
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
    pool_segment_mib: int = 512
    pool_local_buffer_mib: int = 64
    pool_request_ttl_s: float = 60.0
    pool_ssd_dir: str = ""
    kv_staging: str = field(default="auto", metadata={"choices": STAGING})
    kv_staging_mib: int = 64

    def __post_init__(self) -> None:
        if self.pool_protocol not in PROTOCOLS:
            raise ValueError(f"pool_protocol must be one of {PROTOCOLS}")
        if self.pool_protocol == "rdma" and not self.pool_rdma_devices:
            raise ValueError("pool_protocol=rdma needs pool_rdma_devices (e.g. mlx5_0)")
        if ":" not in self.pool_master:
            raise ValueError(f"pool_master must be host:port, got {self.pool_master!r}")
        if self.pool_segment_mib < 0 or self.pool_local_buffer_mib < 1:
            raise ValueError("pool_segment_mib must be >= 0 and pool_local_buffer_mib >= 1")
        if self.pool_request_ttl_s <= 0:
            raise ValueError("pool_request_ttl_s must be positive")
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
    def metadata_server(self) -> str:
        if self.pool_metadata_server:
            return self.pool_metadata_server
        host = self.pool_master.rsplit(":", 1)[0]
        return f"http://{host}:8080/metadata"
