"""A whole kvserve cluster on one machine: what to run (:class:`ClusterSpec`) and running it.

Lifecycle of a :class:`Cluster`:

1. ``ClusterSpec`` is validated and turned, purely, into a :class:`ClusterPlan`: every
   worker's and every router's exact argv, ports and CPU cores;
2. ``start()`` spawns the pool's services when the pool is used (``mooncake_metadata``, the
   HTTP metadata server, then ``mooncake_master``) and waits for their ports, then
   redis-server and waits for PING, then every worker, then the router (or the routers and
   nginx in front of them: :class:`~kvserve.cluster.routers.Routers`), each with its own
   log file in ``log_dir``;
3. it waits until every worker's gRPC health check says SERVING and each router's
   ``/health`` answers 200 counting every worker of the cluster (a router is healthy
   with one decode-capable worker; a cluster is ready only once its routers can place on
   all of them), or raises an error naming the process that failed, with the tail of its
   log; any failure during start stops whatever was started;
4. the cluster serves; tests may kill or restart single workers (:meth:`Cluster.worker`,
   :meth:`Cluster.restart_worker`);
5. ``stop()`` terminates in reverse order (balancer, routers, workers, redis, master, metadata
   server), SIGTERM then SIGKILL after a grace period; it is idempotent and also runs at
   interpreter exit.
"""

from __future__ import annotations

import atexit
import logging
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from kvpool.master import MasterConfig
from kvpool.net import port_open
from kvserve.cluster.health import grpc_serving
from kvserve.cluster.plan import ClusterPlan, ProcessPlan, plan_cluster
from kvserve.cluster.pool import MASTER, METADATA, PoolProcesses
from kvserve.cluster.pool_ha import ha_services, wait_leader
from kvserve.cluster.processes import ManagedProcess
from kvserve.cluster.redis import RedisProcess
from kvserve.cluster.redis_ha import RedisHA
from kvserve.cluster.routers import Routers
from kvserve.cluster.spec import ClusterSpec
from proto.registry import ClusterConfig

__all__ = ["Cluster", "ClusterPlan", "ClusterSpec", "ProcessPlan"]
log = logging.getLogger("kvserve.cluster.launch")
POOL = (METADATA, MASTER)
"""Names of the pool's processes (see :func:`kvserve.cluster.pool.pool_services`)."""


def pool_processes(spec: ClusterSpec, log_dir: Path) -> PoolProcesses:
    """The pool's services: a master and its metadata server, or HA masters and their etcd
    (:mod:`kvserve.cluster.pool_ha`; started once one of them leads)."""
    prefix, ha = spec.prefix_of("mooncake_master"), spec.pool_ha
    if ha is None:
        return PoolProcesses(spec.pool_master, log_dir, prefix)
    services = ha_services(spec.pool_master, ha, log_dir / "etcd-data")
    return PoolProcesses(spec.pool_master, log_dir, prefix, services, lambda t: wait_leader(ha, t))


def redis_service(spec: ClusterSpec, log_dir: Path) -> RedisProcess | RedisHA:
    """The cluster's Redis: one ``redis-server``, or a primary, a replica and Sentinels."""
    prefix = spec.prefix_of("redis")
    if spec.redis_ha_ports:
        replica, *sentinels = spec.redis_ha_ports
        return RedisHA(spec.redis_config, replica, sentinels, log_dir, prefix)
    return RedisProcess(spec.redis_config, log_dir / "redis.log", prefix)


class Cluster:
    """Runs a :class:`ClusterSpec` (see the module docstring for the lifecycle)."""

    def __init__(self, spec: ClusterSpec, available_cores: Sequence[int] | None = None) -> None:
        self.spec = spec
        self.plan = plan_cluster(spec, available_cores)
        self.log_dir = spec.log_dir or Path(tempfile.mkdtemp(prefix="kvserve-cluster-"))
        self._pool: PoolProcesses | None = None
        self._redis: RedisProcess | RedisHA | None = None
        self._workers = {p.name: self._managed(p) for p in self.plan.workers}
        self.routers = Routers(self.plan.routers, spec.router_url, self.log_dir, self._managed)
        self._started = False

    def _managed(self, p: ProcessPlan) -> ManagedProcess:
        log_path = self.log_dir / f"{p.name}.log"
        return ManagedProcess(p.name, p.argv, log_path, dict(p.env), p.cores, p.prefix)

    # -- addresses -------------------------------------------------------------------------

    @property
    def router_url(self) -> str:
        return self.spec.router_url

    @property
    def redis_url(self) -> str:
        """The registry's URL (without credentials: see :attr:`cluster_config`)."""
        return self.spec.cluster_config.redis_url

    @property
    def redis(self) -> RedisProcess | RedisHA | None:
        """The registry's processes (None before :meth:`start`)."""
        return self._redis

    @property
    def cluster_config(self) -> ClusterConfig:
        """What a client of this cluster needs: registry, credentials, gRPC settings."""
        return self.spec.cluster_config

    @property
    def master(self) -> MasterConfig | None:
        """The pool's master, or None when the cluster runs without the pool."""
        return self.spec.pool_master if self.spec.use_pool else None

    @property
    def worker_addresses(self) -> dict[str, list[str]]:
        """``host:port`` of every worker by role (``prefill``, ``decode``, ``mixed``)."""
        out: dict[str, list[str]] = {}
        for p in self.plan.workers:
            out.setdefault(p.role, []).append(p.address)
        return out

    @property
    def worker_names(self) -> list[str]:
        return list(self._workers)

    def worker(self, name: str) -> ManagedProcess:
        """One worker's process (e.g. ``cluster.worker("decode-0").kill()``)."""
        if name not in self._workers:
            raise KeyError(f"no worker {name!r}; workers are {self.worker_names}")
        return self._workers[name]

    def plan_of(self, name: str) -> ProcessPlan:
        """The plan (argv, address, cores) of a worker or of a router."""
        plans = {p.name: p for p in (*self.plan.workers, *self.plan.routers)}
        if name not in plans:
            raise KeyError(f"no planned process {name!r}; there are {sorted(plans)}")
        return plans[name]

    def process(self, name: str) -> ManagedProcess:
        """Any process by name: a worker, a router (``router``, or ``router-<i>`` and
        ``balancer`` with several), ``redis``, ``mooncake_master`` or
        ``mooncake_metadata`` (the pool's HTTP metadata server)."""
        redis = self._redis.process if self._redis is not None else None
        extra: dict[str, ManagedProcess | None] = {**self.routers.processes, "redis": redis}
        extra |= self._pool.processes if self._pool is not None else dict.fromkeys(POOL)
        found = extra.get(name) if name in extra else self.worker(name)
        if found is None:
            raise KeyError(f"{name} is not running in this cluster")
        return found

    # -- lifecycle -------------------------------------------------------------------------

    def start(self, timeout: float | None = None) -> Cluster:
        """Start every process and wait until all are healthy (steps 2-3)."""
        if self._started:
            return self
        self._started = True
        atexit.register(self.stop)
        begin = time.monotonic()
        try:
            self._check_ports_free()
            for note in self.plan.notes:
                log.info("%s", note)
            if self.spec.use_pool:  # held before starting, so stop() reaches it on any error
                self._pool = pool_processes(self.spec, self.log_dir)
                self._pool.start()
            self._redis = redis_service(self.spec, self.log_dir)
            self._redis.start()
            for proc in self._workers.values():
                proc.start()
            self.routers.start()
            self.wait_healthy(timeout=timeout)
        except BaseException:
            self.stop()
            raise
        log.info("cluster healthy in %.1fs (logs in %s)", time.monotonic() - begin, self.log_dir)
        return self

    def _check_ports_free(self) -> None:
        where = {
            n: (self.spec.host_of(n.split()[0]), p) for n, p in self.spec.named_ports().items()
        }
        busy = {f"{n} ({host})": p for n, (host, p) in where.items() if port_open(host, p)}
        if busy:
            raise RuntimeError(
                f"ports already in use: {busy} (another cluster or a system Redis?): choose "
                f"other ports, or free ones (kvserve up --free-ports)"
            )

    def wait_healthy(
        self, names: Sequence[str] | None = None, timeout: float | None = None
    ) -> None:
        """Wait until the named workers (default: all) and the routers are healthy."""
        todo = {n: self.worker(n) for n in (self.worker_names if names is None else names)}
        todo |= self.routers.processes
        limit = timeout or self.spec.startup_timeout_s
        deadline = time.monotonic() + limit
        while todo:
            for name, proc in list(todo.items()):
                if not proc.running:
                    raise proc.failure("exited before it was healthy")
                if name in self.routers.processes:
                    healthy = self.routers.healthy(name, len(self._workers))
                else:
                    address = self.plan_of(name).address
                    healthy = grpc_serving(address, self.spec.cluster_config)
                if healthy:
                    del todo[name]
            if todo and time.monotonic() > deadline:
                name = sorted(todo)[0]
                raise todo[name].failure(f"was not healthy within {limit:g}s")
            if todo:
                time.sleep(0.25)

    def restart_worker(self, name: str, timeout: float | None = None) -> ManagedProcess:
        """Start a worker again (after a kill) with the same argv, and wait until healthy."""
        self.restart_workers([name], timeout)
        return self.worker(name)

    def restart_workers(self, names: Sequence[str], timeout: float | None = None) -> None:
        """Start workers again, all at once, and wait until every one is healthy."""
        for name in names:
            self.worker(name).stop(self.spec.stop_grace_s)
        for name in names:
            self.worker(name).start()
        self.wait_healthy(names, timeout)

    def restart(self, name: str, timeout: float | None = None) -> None:
        """Start a process again (after a kill, or to restart it): a worker (then wait until
        healthy), ``mooncake_master`` or ``mooncake_metadata`` (that one alone, then wait
        for its ports; each comes back empty: the members remount their segments at a new
        master by themselves, the metadata server keeps their entries meanwhile) or
        ``redis`` (wait for PING; it comes back empty: nothing is persisted)."""
        limit = timeout or self.spec.startup_timeout_s
        if self._pool is not None and name in self._pool.processes:
            self._pool.restart(name, self.spec.stop_grace_s, limit)
        elif name == "redis" and self._redis is not None:
            self._redis.restart(self.spec.stop_grace_s, limit)
        elif name in self.routers.processes:
            self.routers.restart(name, self.spec.stop_grace_s, len(self._workers), limit)
        else:
            self.restart_workers([name], timeout)

    def dead(self) -> list[str]:
        """Names of started processes that have exited."""
        procs: list[ManagedProcess | None] = []
        procs += self._pool.processes.values() if self._pool is not None else ()
        procs += self._redis.processes if self._redis else []
        procs += self.routers.processes.values()
        procs += list(self._workers.values())
        return [p.name for p in procs if p is not None and p.pid is not None and not p.running]

    def stop(self) -> None:
        """Terminate in reverse order of start; idempotent (step 5)."""
        grace = self.spec.stop_grace_s
        self.routers.stop(grace)
        for proc in self._workers.values():
            proc.terminate()  # all at once, then wait for each under the same grace
        deadline = time.monotonic() + grace
        for proc in self._workers.values():
            proc.stop(max(0.1, deadline - time.monotonic()))
        if self._redis is not None:
            self._redis.stop(grace)
        if self._pool is not None:
            self._pool.stop(grace)  # the master, then the metadata server
        atexit.unregister(self.stop)

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
