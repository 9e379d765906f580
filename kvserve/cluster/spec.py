"""What a one-machine cluster runs: :class:`ClusterSpec`, purely.

1. A :class:`ClusterSpec` is validated in ``__post_init__`` (counts, ports, timings:
   :func:`kvserve.cluster.spec_checks.check_spec`, over what it reads of a spec);
2. ``spec.with_free_ports()`` optionally swaps every port for a free loopback port;
3. :func:`kvserve.cluster.plan.plan_cluster` gives each worker a disjoint slice of the CPU
   cores when there are at least as many cores as workers (otherwise all share all cores)
   and builds the exact argv of every worker and of the router (that module imports this
   one, never the other way round); :mod:`kvserve.cluster.launch` runs the plan.

Workers are named ``<role>-<i>`` (``prefill-0``, ``decode-0``, ...), in the order prefill,
decode, mixed, and take ports ``worker_base_port + i`` in that order unless
``worker_ports`` lists them. Every engine, pool and registry setting is passed as an
explicit flag; secrets (the Redis password, the cluster secret; the router's API keys to
the router alone) go as their ``KVSERVE_*`` variable in the child's own environment,
always set, so they stay out of process lists (:func:`kvserve.cluster.plan.plan_cluster`).
Of the launcher's environment a child gets only an allow-list
(:func:`kvserve.cluster.processes.child_environment`).
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvpool.config import PoolConfig
from kvpool.confine import parse_peers
from kvpool.master import MasterConfig
from kvpool.net import free_local_ports
from kvserve.cluster.deployment import SEGMENT_MIB
from kvserve.cluster.host import Host
from kvserve.cluster.pool_ha import PoolHA
from kvserve.cluster.redis import RedisConfig, new_password
from kvserve.cluster.redis_ha import sentinel_url
from kvserve.cluster.router_names import BALANCER, ROUTER, host_group, is_router, router_names
from kvserve.cluster.spec_checks import check_spec
from proto.registry import ClusterConfig
from proto.trust import new_secret
from router.config import RouterConfig
from workers.config import EngineConfig, VllmOptions, WorkerConfig
from workers.model.prepare import default_model_dir

ROLE_ORDER = ("prefill", "decode", "mixed")
LOOPBACK = "127.0.0.1"
PRIVATE = ("redis", "mooncake_master")
"""Processes that stay on loopback unless placed on a host of their own (:attr:`hosts`)."""


def new_cluster_config(**fields: Any) -> ClusterConfig:
    """A :class:`ClusterConfig` of ``fields`` whose Redis password and cluster secret, unless
    given, are made up for this run (given as ``""``: none)."""
    fields.setdefault("redis_password", new_password())
    fields.setdefault("cluster_secret", new_secret())
    return ClusterConfig(**fields)


@dataclass(frozen=True)
class ClusterSpec:
    """A cluster on this machine.

    - ``prefill`` / ``decode`` / ``mixed``: worker counts; at least one decode-capable
      (decode or mixed) worker; prefill workers need decode workers and the pool.
    - ``host``: address the router (or the balancer in front of several routers) binds to
      and advertises, loopback by default; every other process not placed on a host of its
      own stays on loopback (:meth:`host_of`): the workers' gRPC and ``/metrics``, Redis,
      the master and the pool endpoints (:data:`PRIVATE`; the pool authenticates nobody):
      ``master_host`` must be loopback.
    - ``hosts``: processes that run elsewhere, by name (``router``, ``redis``,
      ``mooncake_master`` for the pool's services, or a worker's name): each binds to and
      advertises its :class:`Host`'s address and starts under its prefix (e.g. in its own
      network namespace: :mod:`kvserve.cluster.netns`); the others run on ``host``.
    - ``cluster``: the :class:`proto.registry.ClusterConfig` every worker, the router and
      the health checks share (cluster name, heartbeats, Redis credentials, gRPC liveness
      and TLS, cluster secret, hash algorithm); its ``redis_url`` is replaced by this
      cluster's Redis (:attr:`cluster_config`). Redis is started with its credentials
      (:class:`kvserve.cluster.redis.RedisConfig`). By default (:func:`new_cluster_config`)
      a Redis password and a cluster secret made up for this spec (``""`` given: none; no
      password is allowed on loopback only).
    - ``api_key``: the router's API keys (``""``: none; router only).
    - ``router_port``, ``worker_base_port`` (or explicit ``worker_ports``), ``redis_port``,
      ``master`` (mooncake_master's ports and policy): see :meth:`with_free_ports`.
    - ``router_ports``: empty (one router, on ``router_port``), or the ports of several
      routers (at least 2) behind nginx on ``router_port`` (:mod:`.router_names`).
    - ``pool_masters`` / ``pool_ha_ports``: with 2 or more masters, Mooncake's HA mode: they
      elect a leader through three etcd members, listening on ``pool_ha_ports``
      (:class:`kvserve.cluster.pool_ha.PoolHA`: two per etcd member, two per master beyond
      the first, which listens on ``master``'s ports); members address them through etcd.
    - ``redis_ha_ports``: empty, or the ports of Redis's replica and its three Sentinels
      (:class:`kvserve.cluster.redis_ha.RedisHA`; the primary on ``redis_port``).
    - ``worker_metrics_base_port`` (or explicit ``worker_metrics_ports``): each worker's
      Prometheus ``/metrics`` on this port and up, in worker order (0 and none listed: off).
    - ``engine``: forwarded to every worker (the router reads the tokenizer from the same
      model, :attr:`model_dir`); ``threads`` there is overridden by
      ``threads_per_worker`` when that is set; with both 0 a worker gets its core count.
    - ``worker_engine``: which engine the workers run, ``kvserve`` or ``vllm`` (with
      ``vllm``'s settings: :class:`workers.config.VllmOptions`; it needs the pool).
    - ``pool``: forwarded to workers and router, with ``pool_master``,
      ``pool_metadata_server`` and ``pool_local_hostname`` set to this cluster's; with
      ``pool_ssd_dir`` (the SSD tier) each worker gets its own subdirectory
      ``<pool_ssd_dir>/<worker name>`` (the router none: it holds no segment), and the
      master runs with ``master_enable_offload``.
    - ``use_pool``: False runs no master and passes ``--no-use-pool`` (mixed workers only).
    - ``policy`` / ``disagg_threshold_tokens``: router options ('' / None: its defaults);
      ``router_args`` / ``worker_args``: extra flags appended verbatim.
    - ``pin_cores``: pin each worker to its slice of ``cores`` (empty: this process's
      affinity); the router, Redis and the master are never pinned.
    """

    prefill: int = 1
    decode: int = 1
    mixed: int = 0
    host: str = RouterConfig.router_host
    hosts: Mapping[str, Host] = field(default_factory=dict)
    router_port: int = RouterConfig.router_port
    router_ports: tuple[int, ...] = ()
    worker_base_port: int = 50061
    worker_ports: tuple[int, ...] = ()
    worker_metrics_base_port: int = 0
    worker_metrics_ports: tuple[int, ...] = ()
    redis_port: int = 6379
    redis_ha_ports: tuple[int, ...] = ()
    pool_masters: int = 1
    pool_ha_ports: tuple[int, ...] = ()
    cluster: ClusterConfig = field(default_factory=new_cluster_config)
    api_key: str = field(default=RouterConfig.api_key, repr=False)
    master: MasterConfig = field(default_factory=MasterConfig)
    use_pool: bool = WorkerConfig.use_pool
    engine: EngineConfig = field(default_factory=EngineConfig)
    worker_engine: str = "kvserve"
    vllm: VllmOptions = field(default_factory=VllmOptions)
    pool: PoolConfig = field(default_factory=lambda: PoolConfig(pool_segment_mib=SEGMENT_MIB))
    policy: str = ""
    disagg_threshold_tokens: int | None = None
    router_args: tuple[str, ...] = ()
    worker_args: tuple[str, ...] = ()
    pin_cores: bool = True
    threads_per_worker: int = 0
    cores: tuple[int, ...] = ()
    log_dir: Path | None = None
    python: str = field(default_factory=lambda: sys.executable)
    startup_timeout_s: float = 300.0
    stop_grace_s: float = 10.0

    def __post_init__(self) -> None:
        check_spec(self)  # kvserve/cluster/spec_checks.py

    def process_names(self) -> list[str]:
        """Every process that :attr:`hosts` may place: the pool's services (as
        ``mooncake_master``, when used), ``redis``, the workers, the routers (and the
        balancer in front of several)."""
        pool = ["mooncake_master"] if self.use_pool else []
        front = [BALANCER] if self.router_ports else []
        workers = [n for n, _ in self.worker_roles()]
        return [*pool, "redis", *workers, *self.router_names(), *front]

    def router_names(self) -> list[str]:
        """The routers' names (:func:`.router_names.router_names`)."""
        return router_names(self.router_ports)

    def host_of(self, name: str) -> str:
        """The address process ``name`` binds to and advertises: its host's (``hosts``),
        else :attr:`host` for the clients' front (the router, or the balancer in front of
        several), else loopback: the workers' gRPC, ``/metrics`` and transfer ports, the
        routers behind the balancer, Redis and the master (:data:`PRIVATE`) are for the
        cluster only, and without ``hosts`` the whole cluster runs on this machine."""
        host = self._placed(name)
        if host is not None:
            return host.address
        return self.host if name in (ROUTER, BALANCER) else LOOPBACK

    def prefix_of(self, name: str) -> tuple[str, ...]:
        """The argv prefix that starts process ``name`` on its host."""
        host = self._placed(name)
        return host.prefix if host is not None else ()

    def _placed(self, name: str) -> Host | None:
        """The host ``name`` is placed on (:func:`.router_names.host_group`), if any."""
        return self.hosts.get(name) or self.hosts.get(host_group(name))

    @property
    def num_workers(self) -> int:
        return self.prefill + self.decode + self.mixed

    def worker_roles(self) -> list[tuple[str, str]]:
        """``(name, role)`` of every worker, in port order."""
        counts = {"prefill": self.prefill, "decode": self.decode, "mixed": self.mixed}
        return [(f"{r}-{i}", r) for r in ROLE_ORDER for i in range(counts[r])]

    def _worker_ports(self) -> list[int]:
        return list(self.worker_ports) or [
            self.worker_base_port + i for i in range(self.num_workers)
        ]

    def worker_metrics_port(self, index: int) -> int:
        """The ``/metrics`` port of the ``index``-th worker (0: none)."""
        if self.worker_metrics_ports:
            return self.worker_metrics_ports[index]
        return self.worker_metrics_base_port + index if self.worker_metrics_base_port else 0

    def named_ports(self) -> dict[str, int]:
        """Every port this cluster listens on, by process (for the in-use check; the
        process is the name's first word)."""
        named = {BALANCER if self.router_ports else ROUTER: self.router_port}
        named.update(zip(self.router_names(), self.router_ports, strict=False))
        named["redis"] = self.redis_port
        named.update({f"redis ha {i}": port for i, port in enumerate(self.redis_ha_ports)})
        names = [n for n, _ in self.worker_roles()]
        named.update(zip(names, self._worker_ports(), strict=True))
        metrics = {f"{n} metrics": self.worker_metrics_port(i) for i, n in enumerate(names)}
        named.update({name: port for name, port in metrics.items() if port})
        named.update({f"pool ha {i}": port for i, port in enumerate(self.pool_ha_ports)})
        if self.use_pool:
            m = self.master
            named["mooncake_master rpc"] = m.master_port
            named["mooncake_master metadata"] = m.master_metadata_port
            named["mooncake_master metrics"] = m.master_metrics_port
        return named

    @property
    def model_dir(self) -> str:
        """The workers' model: ``engine.model``, or the default one in this process's cache."""
        return self.engine.model or str(default_model_dir())

    @property
    def router_url(self) -> str:
        return f"http://{self.host_of('router')}:{self.router_port}"

    @property
    def redis_config(self) -> RedisConfig:
        return RedisConfig(
            host=self.host_of("redis"),
            port=self.redis_port,
            username=self.cluster.redis_username,
            password=self.cluster.redis_password,
            cluster=self.cluster.cluster,
        )

    @property
    def cluster_config(self) -> ClusterConfig:
        """:attr:`cluster` reaching this cluster's Redis (through its Sentinels, with
        :attr:`redis_ha_ports`)."""
        url = self.redis_config.url
        if self.redis_ha_ports:
            url = sentinel_url(self.redis_config, self.redis_ha_ports[1:])
        return dataclasses.replace(self.cluster, redis_url=url)

    @property
    def pool_master(self) -> MasterConfig:
        """``master`` on its host (see :attr:`hosts`), offloading when ``pool`` has an
        SSD tier."""
        master = self.master
        if self.pool.pool_ssd_dir and not master.master_enable_offload:
            master = dataclasses.replace(master, master_enable_offload=True)
        if "mooncake_master" not in self.hosts:
            return master
        return dataclasses.replace(master, master_host=self.host_of("mooncake_master"))

    @property
    def pool_ha(self) -> PoolHA | None:
        """Where the HA masters and their etcd listen (None with one master)."""
        if self.pool_masters < 2:
            return None
        return PoolHA.of(self.pool_master, self.pool_masters, self.pool_ha_ports)

    def pool_config(self, name: str) -> PoolConfig:
        """The pool settings of process ``name`` (a worker or the router). On separate
        hosts (:attr:`hosts`), ``pool_peers`` left at ``auto`` becomes the workers' own
        addresses: only they move KV between transfer engines (the router holds no
        segment), and this machine's own address on the hosts' network, which every local
        user reaches them from, is not one of them."""
        ssd, ha, master = self.pool.pool_ssd_dir, self.pool_ha, self.pool_master
        peers = self.pool.pool_peers
        if self._placed(name) and parse_peers(peers) is None:
            peers = ",".join(sorted({self.host_of(w) for w, _ in self.worker_roles()}))
        return dataclasses.replace(
            self.pool,
            pool_master=ha.address if ha else master.rpc_address,
            pool_metadata_server="" if ha else master.metadata_url,  # HA: P2P handshakes
            master_metrics_url=ha.metrics_urls if ha else master.metrics_url,
            pool_local_hostname=self.host_of(name) if self._placed(name) else LOOPBACK,
            pool_ssd_dir=str(Path(ssd) / name) if ssd and not is_router(name) else "",
            pool_peers=peers,
        )

    def with_free_ports(self) -> ClusterSpec:
        """This spec with every port replaced by one free on loopback right now."""
        n = self.num_workers
        scraped = n if self.worker_metrics_port(0) else 0
        ha, routers, pool = (
            len(self.redis_ha_ports),
            len(self.router_ports),
            len(self.pool_ha_ports),
        )
        wanted = 5 + ha + routers + pool + n + scraped
        router, redis_port, rpc, meta, metrics, *rest = free_local_ports(wanted)
        redis_ha_ports, router_ports = tuple(rest[:ha]), tuple(rest[ha : ha + routers])
        pool_ha_ports = tuple(rest[ha + routers : ha + routers + pool])
        workers = rest[ha + routers + pool :]
        master = dataclasses.replace(
            self.master, master_port=rpc, master_metadata_port=meta, master_metrics_port=metrics
        )
        return dataclasses.replace(
            self,
            router_port=router,
            router_ports=router_ports,
            pool_ha_ports=pool_ha_ports,
            redis_port=redis_port,
            redis_ha_ports=redis_ha_ports,
            master=master,
            worker_ports=tuple(workers[:n]),
            worker_metrics_ports=tuple(workers[n:]),
        )
