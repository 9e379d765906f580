"""What a one-machine cluster runs: :class:`ClusterSpec` -> :class:`ClusterPlan`, purely.

1. A :class:`ClusterSpec` is validated in ``__post_init__`` (counts, ports, timings);
2. ``spec.with_free_ports()`` optionally swaps every port for a free loopback port;
3. ``spec.plan(cores)`` gives each worker a disjoint slice of the CPU cores when there are
   at least as many cores as workers (otherwise all share all cores) and builds the exact
   argv of every worker and of the router; :mod:`kvserve.cluster` runs the plan.

Workers are named ``<role>-<i>`` (``prefill-0``, ``decode-0``, ...), in the order prefill,
decode, mixed, and take ports ``worker_base_port + i`` in that order unless
``worker_ports`` lists them. Every engine, pool and registry setting is passed as an
explicit flag, so a worker never picks up a stray ``KVSERVE_*`` variable of the launcher;
secrets (fields declared ``repr=False``, i.e. the Redis password) go instead as their
``KVSERVE_*`` variable in the child's environment, always set, so they stay out of
process lists (:func:`secret_env`).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kvpool.config import PoolConfig
from kvpool.master import MasterConfig, free_local_ports
from kvserve.process_plan import (
    ClusterPlan,
    Host,
    ProcessPlan,
    config_argv,
    secret_env,
    split_cores,
)
from kvserve.redis_service import RedisConfig
from proto.registry import ClusterConfig
from workers.config import EngineConfig

ROLE_ORDER = ("prefill", "decode", "mixed")


@dataclass(frozen=True)
class ClusterSpec:
    """A cluster on this machine.

    - ``prefill`` / ``decode`` / ``mixed``: worker counts; at least one decode-capable
      (decode or mixed) worker; prefill workers need decode workers and the pool.
    - ``host``: address every process binds to and advertises (loopback by default).
    - ``hosts``: processes that run elsewhere, by name (``router``, ``redis``,
      ``mooncake_master`` for the pool's services, or a worker's name): each binds to and
      advertises its :class:`Host`'s address and starts under its prefix (e.g. in its own
      network namespace: :mod:`kvserve.netns`); the others run on ``host``.
    - ``redis_username`` / ``redis_password``: Redis is started with these credentials
      (:class:`kvserve.redis_service.RedisConfig`) and every process gets them, the password
      through its environment.
    - ``peer_timeout_s`` / ``grpc_tls_cert`` / ``grpc_tls_key`` / ``grpc_tls_ca``: gRPC
      liveness and TLS of every worker, the router and the health checks
      (:class:`proto.registry.ClusterConfig`).
    - ``router_port``, ``worker_base_port`` (or explicit ``worker_ports``), ``redis_port``,
      ``master`` (mooncake_master's ports and policy): see :meth:`with_free_ports`.
    - ``engine``: forwarded to every worker; ``threads`` there is overridden by
      ``threads_per_worker`` when that is set; with both 0 a worker gets its core count.
    - ``pool``: forwarded to workers and router, with ``pool_master``,
      ``pool_metadata_server`` and ``pool_local_hostname`` set to this cluster's.
    - ``use_pool``: False runs no master and passes ``--no-use-pool`` (mixed workers only).
    - ``policy`` / ``disagg_threshold_tokens``: router options ('' / None: its defaults);
      ``router_args`` / ``worker_args``: extra flags appended verbatim.
    - ``pin_cores``: pin each worker to its slice of ``cores`` (empty: this process's
      affinity); the router, Redis and the master are never pinned.
    """

    prefill: int = 1
    decode: int = 1
    mixed: int = 0
    host: str = "127.0.0.1"
    hosts: Mapping[str, Host] = field(default_factory=dict)
    router_port: int = 8000
    worker_base_port: int = 50061
    worker_ports: tuple[int, ...] = ()
    redis_port: int = 6379
    redis_username: str = ""
    redis_password: str = field(default="", repr=False)
    peer_timeout_s: float = 5.0
    grpc_tls_cert: str = ""
    grpc_tls_key: str = ""
    grpc_tls_ca: str = ""
    master: MasterConfig = field(default_factory=MasterConfig)
    use_pool: bool = True
    engine: EngineConfig = field(default_factory=EngineConfig)
    pool: PoolConfig = field(default_factory=lambda: PoolConfig(pool_segment_mib=256))
    cluster_name: str = "kvserve"
    heartbeat_s: float = 1.0
    heartbeat_ttl_s: float = 3.0
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
        counts = {"prefill": self.prefill, "decode": self.decode, "mixed": self.mixed}
        if min(counts.values()) < 0:
            raise ValueError(f"worker counts must be >= 0, got {counts}")
        if self.decode + self.mixed < 1:
            raise ValueError("a cluster needs a decode-capable worker: set decode or mixed >= 1")
        if self.prefill and not self.decode:
            raise ValueError("prefill workers hand requests to decode workers: set decode >= 1")
        if self.prefill and not self.use_pool:
            raise ValueError(
                "prefill/decode moves KV through the pool: keep use_pool, or run mixed workers only"
            )
        if self.worker_ports and len(self.worker_ports) != self.num_workers:
            raise ValueError(
                f"worker_ports lists {len(self.worker_ports)} ports for {self.num_workers} workers"
            )
        ports = list(self.named_ports().values())
        if any(not 0 < p < 65536 for p in ports) or len(set(ports)) != len(ports):
            raise ValueError(f"ports must be distinct and in 1..65535, got {sorted(ports)}")
        if self.threads_per_worker < 0:
            raise ValueError("threads_per_worker must be >= 0 (0: the worker's core count)")
        if any(c < 0 for c in self.cores) or len(set(self.cores)) != len(self.cores):
            raise ValueError(f"cores must be distinct CPU numbers, got {self.cores}")
        if self.disagg_threshold_tokens is not None and self.disagg_threshold_tokens < 0:
            raise ValueError("disagg_threshold_tokens must be >= 0 (None: router default)")
        if self.startup_timeout_s <= 0 or self.stop_grace_s <= 0:
            raise ValueError("startup_timeout_s and stop_grace_s must be positive")
        self._check_hosts()
        _ = self.cluster_config  # validates cluster_name, heartbeats, credentials, TLS

    def _check_hosts(self) -> None:
        unknown = set(self.hosts) - set(self.process_names())
        if unknown:
            raise ValueError(f"hosts names {sorted(unknown)}: not in {self.process_names()}")
        for name in ("", *self.hosts):
            address = self.host_of(name)
            if not address or address in ("0.0.0.0", "::"):
                raise ValueError(
                    f"{name or 'host'} must be an address others reach it at (it is "
                    f"advertised), e.g. 127.0.0.1, got {address!r}"
                )

    def process_names(self) -> list[str]:
        """Every process that :attr:`hosts` may place: the pool's services (as
        ``mooncake_master``, when used), ``redis``, the workers, ``router``."""
        pool = ["mooncake_master"] if self.use_pool else []
        return [*pool, "redis", *(n for n, _ in self.worker_roles()), "router"]

    def host_of(self, name: str) -> str:
        """The address process ``name`` binds to and advertises."""
        host = self.hosts.get(name)
        return host.address if host is not None else self.host

    def prefix_of(self, name: str) -> tuple[str, ...]:
        """The argv prefix that starts process ``name`` on its host."""
        host = self.hosts.get(name)
        return host.prefix if host is not None else ()

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

    def named_ports(self) -> dict[str, int]:
        """Every port this cluster listens on, by process (for the in-use check; the
        process is the name's first word)."""
        named = {"router": self.router_port, "redis": self.redis_port}
        named.update(zip((n for n, _ in self.worker_roles()), self._worker_ports(), strict=True))
        if self.use_pool:
            m = self.master
            named["mooncake_master rpc"] = m.master_port
            named["mooncake_master metadata"] = m.master_metadata_port
            named["mooncake_master metrics"] = m.master_metrics_port
        return named

    @property
    def router_url(self) -> str:
        return f"http://{self.host_of('router')}:{self.router_port}"

    @property
    def redis_config(self) -> RedisConfig:
        return RedisConfig(
            host=self.host_of("redis"),
            port=self.redis_port,
            username=self.redis_username,
            password=self.redis_password,
        )

    @property
    def cluster_config(self) -> ClusterConfig:
        return dataclasses.replace(
            self.redis_config.cluster_config,
            cluster=self.cluster_name,
            heartbeat_s=self.heartbeat_s,
            heartbeat_ttl_s=self.heartbeat_ttl_s,
            peer_timeout_s=self.peer_timeout_s,
            grpc_tls_cert=self.grpc_tls_cert,
            grpc_tls_key=self.grpc_tls_key,
            grpc_tls_ca=self.grpc_tls_ca,
        )

    @property
    def pool_master(self) -> MasterConfig:
        """``master`` on its host (see :attr:`hosts`)."""
        if "mooncake_master" not in self.hosts:
            return self.master
        return dataclasses.replace(self.master, master_host=self.host_of("mooncake_master"))

    def pool_config(self, name: str) -> PoolConfig:
        """The pool settings of process ``name`` (a worker or the router)."""
        return dataclasses.replace(
            self.pool,
            pool_master=self.pool_master.rpc_address,
            pool_metadata_server=self.pool_master.metadata_url,
            pool_local_hostname=self.host_of(name),
        )

    def with_free_ports(self) -> ClusterSpec:
        """This spec with every port replaced by one free on loopback right now."""
        router, redis_port, rpc, meta, metrics, *workers = free_local_ports(5 + self.num_workers)
        master = dataclasses.replace(
            self.master, master_port=rpc, master_metadata_port=meta, master_metrics_port=metrics
        )
        return dataclasses.replace(
            self,
            router_port=router,
            redis_port=redis_port,
            master=master,
            worker_ports=tuple(workers),
        )

    def plan(self, available_cores: Sequence[int] | None = None) -> ClusterPlan:
        """Exact argv, port and cores of every worker and the router (pure given the cores;
        ``available_cores`` defaults to ``cores``, then to this process's affinity)."""
        cores = list(available_cores or self.cores or sorted(os.sched_getaffinity(0)))
        slices, shared = split_cores(cores, self.num_workers)
        auto_threads = max(1, len(cores) // self.num_workers)
        notes = []
        if shared and self.pin_cores:
            notes.append(
                f"{self.num_workers} workers share {len(cores)} cores {cores} "
                f"(fewer cores than workers): {auto_threads} thread(s) each"
            )
        workers = []
        for (name, role), port, mine in zip(
            self.worker_roles(), self._worker_ports(), slices, strict=True
        ):
            pinned = self.pin_cores and not shared
            threads = self.threads_per_worker or self.engine.threads
            threads = threads or (len(mine) if pinned else auto_threads)
            cores_of = mine if self.pin_cores else ()
            workers.append(self._worker_plan(name, role, port, cores_of, threads))
        return ClusterPlan(tuple(workers), self._router_plan(), shared, tuple(notes))

    def _worker_plan(
        self, name: str, role: str, port: int, cores: tuple[int, ...], threads: int
    ) -> ProcessPlan:
        engine = dataclasses.replace(self.engine, threads=threads)
        pool = config_argv(self.pool_config(name)) if self.use_pool else ["--no-use-pool"]
        host = self.host_of(name)
        argv = [self.python, "-m", "kvserve", "worker", "--role", role]
        argv += ["--worker-host", host, "--worker-port", str(port), "--worker-id", name]
        argv += [*config_argv(engine), *pool, *config_argv(self.cluster_config)]
        env = (
            ("OMP_NUM_THREADS", str(threads)),
            ("PYTHONUNBUFFERED", "1"),
            *secret_env(self.cluster_config),
        )
        argv += self.worker_args
        return ProcessPlan(name, role, tuple(argv), host, port, cores, env, self.prefix_of(name))

    def _router_plan(self) -> ProcessPlan:
        host = self.host_of("router")
        argv = [self.python, "-m", "kvserve", "router", "--router-host", host]
        argv += ["--router-port", str(self.router_port), *config_argv(self.cluster_config)]
        if self.use_pool:
            argv += config_argv(self.pool_config("router"))
            argv += ["--master-metrics-url", self.pool_master.metrics_url]
        else:
            argv += ["--no-pool-lookup"]
        if self.policy:
            argv += ["--policy", self.policy]
        if self.disagg_threshold_tokens is not None:
            argv += ["--disagg-threshold-tokens", str(self.disagg_threshold_tokens)]
        env = (("PYTHONUNBUFFERED", "1"), *secret_env(self.cluster_config))
        argv += self.router_args
        prefix = self.prefix_of("router")
        return ProcessPlan("router", "router", tuple(argv), host, self.router_port, (), env, prefix)
