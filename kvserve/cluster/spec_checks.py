"""What a :class:`~kvserve.cluster.spec.ClusterSpec` must satisfy: :func:`check_spec`,
called as it is built (every count, port, host and credential, and the ways they combine).

Owns :class:`CheckedSpec`, what the checks read of a spec: the spec calls them from its
``__post_init__``, so this module imports no spec.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from kvpool.master import MasterConfig
from kvserve.cluster.host import Host
from kvserve.cluster.pool_ha import ha_ports_needed
from kvserve.cluster.redis import is_loopback
from kvserve.cluster.redis_ha import HA_PORTS
from kvserve.cluster.router_names import ROUTER
from proto.registry import ClusterConfig
from router.api.auth import parse_api_keys
from router.api.edge import WILDCARD_BINDS, bare_host
from workers.config import ENGINES


class CheckedSpec(Protocol):
    """The fields and derived values of a :class:`~kvserve.cluster.spec.ClusterSpec` that
    :func:`check_spec` reads (there, each is documented)."""

    @property
    def prefill(self) -> int: ...
    @property
    def decode(self) -> int: ...
    @property
    def mixed(self) -> int: ...
    @property
    def num_workers(self) -> int: ...
    @property
    def worker_engine(self) -> str: ...
    @property
    def use_pool(self) -> bool: ...
    @property
    def host(self) -> str: ...
    @property
    def hosts(self) -> Mapping[str, Host]: ...
    @property
    def router_ports(self) -> tuple[int, ...]: ...
    @property
    def worker_ports(self) -> tuple[int, ...]: ...
    @property
    def worker_metrics_ports(self) -> tuple[int, ...]: ...
    @property
    def redis_ha_ports(self) -> tuple[int, ...]: ...
    @property
    def pool_masters(self) -> int: ...
    @property
    def pool_ha_ports(self) -> tuple[int, ...]: ...
    @property
    def pool_master(self) -> MasterConfig: ...
    @property
    def cluster_config(self) -> ClusterConfig: ...
    @property
    def api_key(self) -> str: ...
    @property
    def threads_per_worker(self) -> int: ...
    @property
    def cores(self) -> tuple[int, ...]: ...
    @property
    def disagg_threshold_tokens(self) -> int | None: ...
    @property
    def startup_timeout_s(self) -> float: ...
    @property
    def stop_grace_s(self) -> float: ...
    def named_ports(self) -> dict[str, int]: ...
    def process_names(self) -> list[str]: ...
    def host_of(self, name: str) -> str: ...


def check_spec(spec: CheckedSpec) -> None:
    """Raise ValueError naming what is wrong with ``spec`` (every field and their mix)."""
    counts = {"prefill": spec.prefill, "decode": spec.decode, "mixed": spec.mixed}
    if min(counts.values()) < 0:
        raise ValueError(f"worker counts must be >= 0, got {counts}")
    if spec.decode + spec.mixed < 1:
        raise ValueError("a cluster needs a decode-capable worker: set decode or mixed >= 1")
    if spec.prefill and not spec.decode:
        raise ValueError("prefill workers hand requests to decode workers: set decode >= 1")
    if spec.worker_engine not in ENGINES:
        raise ValueError(f"worker_engine must be one of {ENGINES}, got {spec.worker_engine!r}")
    if spec.worker_engine == "vllm" and not spec.use_pool:
        raise ValueError("vLLM workers serve through the KV pool: keep use_pool")
    if spec.prefill and not spec.use_pool:
        raise ValueError(
            "prefill/decode moves KV through the pool: keep use_pool, or run mixed workers only"
        )
    if len(spec.router_ports) == 1:
        raise ValueError("router_ports: none (one router on router_port) or at least 2")
    if spec.pool_masters < 1 or (spec.pool_masters > 1 and not spec.use_pool):
        raise ValueError("pool_masters: at least 1, and several need use_pool")
    if spec.pool_masters > 1 and len(spec.pool_ha_ports) != ha_ports_needed(spec.pool_masters):
        need = ha_ports_needed(spec.pool_masters)
        raise ValueError(f"pool_ha_ports: {need} ports for {spec.pool_masters} masters")
    if spec.redis_ha_ports and len(set(spec.redis_ha_ports)) != HA_PORTS:
        raise ValueError(f"redis_ha_ports: {HA_PORTS} distinct ports (a replica, 3 Sentinels)")
    if spec.worker_ports and len(spec.worker_ports) != spec.num_workers:
        raise ValueError(
            f"worker_ports lists {len(spec.worker_ports)} ports for {spec.num_workers} workers"
        )
    listed = len(spec.worker_metrics_ports)
    if listed and listed != spec.num_workers:
        raise ValueError(
            f"worker_metrics_ports lists {listed} ports for {spec.num_workers} workers"
        )
    ports = list(spec.named_ports().values())
    if any(not 0 < p < 65536 for p in ports) or len(set(ports)) != len(ports):
        raise ValueError(f"ports must be distinct and in 1..65535, got {sorted(ports)}")
    if spec.threads_per_worker < 0:
        raise ValueError("threads_per_worker must be >= 0 (0: the worker's core count)")
    if any(c < 0 for c in spec.cores) or len(set(spec.cores)) != len(spec.cores):
        raise ValueError(f"cores must be distinct CPU numbers, got {spec.cores}")
    if spec.disagg_threshold_tokens is not None and spec.disagg_threshold_tokens < 0:
        raise ValueError("disagg_threshold_tokens must be >= 0 (None: router default)")
    if spec.startup_timeout_s <= 0 or spec.stop_grace_s <= 0:
        raise ValueError("startup_timeout_s and stop_grace_s must be positive")
    _check_hosts(spec)
    _ = spec.cluster_config  # validates the credentials against this cluster's Redis
    parse_api_keys(spec.api_key)  # raises, without the key, when malformed


def _check_hosts(spec: CheckedSpec) -> None:
    unknown = set(spec.hosts) - {*spec.process_names(), ROUTER}  # router: all of them
    if unknown:
        raise ValueError(f"hosts names {sorted(unknown)}: not in {spec.process_names()}")
    for name in ("", *spec.hosts):
        address = spec.host_of(name) if name else spec.host
        if bare_host(address) in WILDCARD_BINDS:
            raise ValueError(
                f"{name or 'host'} must be an address others reach it at (it is "
                f"advertised), e.g. 127.0.0.1, got {address!r}"
            )
    master = spec.pool_master.master_host
    if spec.use_pool and "mooncake_master" not in spec.hosts and not is_loopback(master):
        raise ValueError(
            f"master_host {master!r}: the pool authenticates nobody, so it stays on "
            f"loopback (or on a private host of its own: kvserve up --hosts)"
        )
