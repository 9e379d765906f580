"""The KV pool's services (both from the Mooncake wheel), run as
:class:`~kvserve.cluster.processes.ManagedProcess` children:

- ``mooncake_http_metadata_server``: the transfer engine's HTTP metadata store, where every
  pool member publishes its segment and RPC endpoint (``http://host:port/metadata``);
- ``mooncake_master``: the pool's metadata (which object lives in which member's segment),
  evictions under memory pressure, metrics.

The master can embed the metadata server, but 0.3.13's embedded one binds 0.0.0.0 whatever
``--http_metadata_server_host`` says, so the master runs with it off and the standalone
server runs next to it. Every listening service binds to ``host`` (127.0.0.1 by default):
the metadata and REST services of this Mooncake version are unauthenticated, so binding
them to a public interface is an explicit operator choice.

:func:`pool_services` is the one place that says how the pool's processes are run: their
names, argv, readiness ports and start order (metadata server, then master; stop in
reverse). Each becomes a :class:`ManagedProcess` whose readiness is "its ports accept
connections" (and, before spawning, "nobody else listens there": the metadata server does
not exit when it cannot bind). :class:`PoolProcesses` runs them for ``kvserve up`` (each in
its own process group and log, ``log_dir/<name>.log``); :class:`MasterProcess` for
``kvserve pool``, benchmarks and tests (in the launcher's process group, so a terminal's
Ctrl-C reaches them, sharing one log file or the launcher's output).

Lifecycle of both: ``start()`` starts each service in order and waits until its ports
accept connections; on failure it stops what it started and the error names the log ->
``restart(name)`` stops and starts one of them (the master alone: members keep their
entries in the metadata server and remount at the new master by themselves) -> ``stop()``
stops them in reverse order (SIGTERM, SIGKILL after a grace period); idempotent.
"""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from kvpool.confine import service_env
from kvpool.master import MasterConfig
from kvpool.net import port_open
from kvserve.cluster.processes import ManagedProcess, Readiness
from kvserve.extras import POOL, install_hint
from workers.model.prepare import cache_dir


def wheel_binary(name: str) -> Path:
    """The Mooncake wheel's executable ``name`` next to this interpreter, or on ``PATH``."""
    local = Path(sys.executable).parent / name
    found = local if local.is_file() else shutil.which(name)
    if not found:
        raise FileNotFoundError(
            f"{name} not found: it comes with Mooncake Store, {install_hint(POOL)}"
        )
    return Path(found)


def master_binary() -> Path:
    """The ``mooncake_master`` next to this interpreter, or on ``PATH``."""
    return wheel_binary("mooncake_master")


def metadata_command(cfg: MasterConfig) -> list[str]:
    """The standalone HTTP metadata server on ``master_host:master_metadata_port`` (it serves
    ``/metadata``, :attr:`MasterConfig.metadata_url`); warnings only, not one access-log
    line per request (every member refreshes its entry every few seconds)."""
    return [
        str(wheel_binary("mooncake_http_metadata_server")),
        "--host",
        cfg.master_host,
        "--port",
        str(cfg.master_metadata_port),
        "--log-level",
        "WARNING",
    ]


def master_command(cfg: MasterConfig) -> list[str]:
    """The master, its embedded metadata server off (:func:`metadata_command` runs one).

    The ``--http_metadata_server_*`` flags are inert while it is off; they are kept so that
    turning it back on could not silently fall back to the 0.0.0.0 default."""
    return [
        str(master_binary()),
        f"--rpc_address={cfg.master_host}",
        f"--rpc_port={cfg.master_port}",
        "--enable_http_metadata_server=false",
        f"--http_metadata_server_host={cfg.master_host}",
        f"--http_metadata_server_port={cfg.master_metadata_port}",
        f"--metrics_host={cfg.master_host}",
        f"--metrics_port={cfg.master_metrics_port}",
        f"--client_ttl={cfg.master_client_ttl_s}",
        f"--eviction_high_watermark_ratio={cfg.master_eviction_high_watermark}",
        f"--eviction_ratio={cfg.master_eviction_ratio}",
        *offload_flags(cfg),
        *ha_flags(cfg),
    ]


def ha_flags(cfg: MasterConfig) -> list[str]:
    """The master's HA-mode flags (none without ``master_etcd_endpoints``)."""
    if not cfg.master_etcd_endpoints:
        return []
    return ["--enable_ha=true", f"--etcd_endpoints={cfg.master_etcd_endpoints}"]


def offload_flags(cfg: MasterConfig) -> list[str]:
    """The master's SSD-offload flags (none when ``master_enable_offload`` is off)."""
    if not cfg.master_enable_offload:
        return []
    flags = ["--enable_offload=true"]
    if cfg.master_offload_on_evict:
        flags.append("--offload_on_evict=true")
    if cfg.master_promotion_on_hit:
        flags.append("--promotion_on_hit=true")
    return flags


START_TIMEOUT_S = 60.0
"""Seconds each pool service has to be ready at a start: the metadata server is a Python
process, and on 2 loaded cores one took over 20 s to open its port (a CI run of the suite);
a service that exits fails the start at once."""
METADATA = "mooncake_metadata"
MASTER = "mooncake_master"


@dataclass(frozen=True)
class PoolService:
    """One process of the pool: its name, argv, and the ports on ``host`` that accept
    connections once it is ready."""

    name: str
    argv: tuple[str, ...]
    host: str
    ports: tuple[int, ...]
    env: tuple[tuple[str, str], ...] = ()
    """Its own environment: the confinement library on loopback (:func:`service_env`)."""

    def ready(self) -> bool:
        return all(port_open(self.host, p) for p in self.ports)

    def check_ports_free(self) -> None:
        """Raise if something already listens on one of the ports: checked before starting,
        as readiness is "the ports answer" and the metadata server does not exit when it
        cannot bind."""
        busy = [p for p in self.ports if port_open(self.host, p)]
        if busy:
            ports = ", ".join(map(str, busy))
            raise RuntimeError(f"{self.name}: port {ports} on {self.host} is already in use")

    @property
    def readiness(self) -> Readiness:
        """Ready once every port accepts connections; refused while one is taken."""
        failure = f"did not open its ports {self.ports} on {self.host}"
        return Readiness(self.ready, failure, before=self.check_ports_free)


def pool_services(cfg: MasterConfig) -> tuple[PoolService, ...]:
    """The pool's processes in start order: the metadata server (:data:`METADATA`), then the
    master (:data:`MASTER`). Start each after the previous one is ready; stop in reverse.
    The master alone may be restarted: the metadata server keeps the members' entries and
    they remount their segments at the new master by themselves. A master in HA mode
    (``master_etcd_endpoints``) runs alone, ready once its metrics port answers (a standby
    serves no RPC). On loopback each serves only this user's processes
    (:func:`kvpool.confine.service_env`): another local user can neither redirect the
    members' transfers through the metadata server nor mount a segment of its own."""
    env = tuple(service_env(cfg.master_host, cache_dir()).items())
    master = tuple(master_command(cfg))
    if cfg.master_etcd_endpoints:
        return (PoolService(MASTER, master, cfg.master_host, (cfg.master_metrics_port,), env),)
    metadata, host = tuple(metadata_command(cfg)), cfg.master_host
    return (
        PoolService(METADATA, metadata, host, (cfg.master_metadata_port,), env),
        PoolService(MASTER, master, host, (cfg.master_port, cfg.master_metrics_port), env),
    )


class PoolProcesses:
    """The pool's services of one cluster (:func:`pool_services`), each a
    :class:`ManagedProcess` in its own process group, logging to ``log_dir/<name>.log``
    (``prefix`` runs each inside a network namespace). Lifecycle: module docstring."""

    def __init__(
        self,
        cfg: MasterConfig,
        log_dir: Path,
        prefix: Sequence[str] = (),
        services: Sequence[PoolService] | None = None,
        ready: Callable[[float], object] | None = None,
    ) -> None:
        self.cfg = cfg
        self.processes = {
            s.name: ManagedProcess(
                s.name,
                s.argv,
                log_dir / f"{s.name}.log",
                env=dict(s.env),
                prefix=prefix,
                ready=s.readiness,
            )
            for s in (pool_services(cfg) if services is None else services)
        }
        """Every service's process by name, in start order (``services``: others than
        :func:`pool_services`', e.g. :func:`kvserve.cluster.pool_ha.ha_services`)."""
        self._ready = ready
        """Waited on (with the start's timeout) once every service runs (HA: a leader)."""

    def start(self, timeout: float = START_TIMEOUT_S) -> PoolProcesses:
        """Start every service in order, each given ``timeout`` seconds to be ready;
        whatever is left of an earlier start is stopped first."""
        self.stop()
        try:
            for proc in self.processes.values():
                proc.start(timeout)
            if self._ready is not None:
                self._ready(timeout)
        except BaseException:  # also Ctrl-C while starting: nothing is left running
            self.stop()
            raise
        return self

    def restart(
        self, name: str, grace: float | None = None, timeout: float = START_TIMEOUT_S
    ) -> None:
        """Stop service ``name`` (``grace`` seconds before SIGKILL), start it again and wait
        until it is ready; on failure it is left stopped and the error names its log."""
        self.processes[name].restart(grace, timeout)

    @property
    def pids(self) -> dict[str, int]:
        """Process id of each started service, by name (:data:`METADATA`, :data:`MASTER`)."""
        return {name: p.pid for name, p in self.processes.items() if p.pid is not None}

    @property
    def running(self) -> bool:
        """Whether every service was started and none has exited."""
        return all(p.running for p in self.processes.values())

    def wait(self) -> int:
        """Block until one of the services exits (the pool is unusable then); returns its
        exit code. The others keep running until :meth:`stop`."""
        assert self.pids, "not started"
        while True:
            for proc in self.processes.values():
                code = proc.returncode
                if code is not None:
                    return code
            time.sleep(0.1)

    def terminate(self) -> None:
        """Ask every service to exit without waiting (safe inside a signal handler)."""
        for proc in self.processes.values():
            proc.terminate()

    def stop(self, grace: float | None = None) -> None:
        """Stop every service in reverse start order, each with ``grace`` seconds before
        SIGKILL (default: the process's own); idempotent."""
        for proc in reversed(list(self.processes.values())):
            proc.stop(grace)

    def __enter__(self) -> PoolProcesses:
        return self.start() if not self.running else self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class MasterProcess(PoolProcesses):
    """The pool's services as foreground children of this process (``kvserve pool``,
    benchmarks, tests): they stay in our process group and environment, so a terminal's
    Ctrl-C reaches them too; they share one log file, ``log_path`` (emptied at each
    start), or our own output if None; ``stop()`` gives each 5 s before SIGKILL.
    The lifecycle is :class:`PoolProcesses`'s."""

    def __init__(self, cfg: MasterConfig, log_path: Path | None = None) -> None:
        self.cfg = cfg
        self.log_path = log_path
        self._ready = None
        self.processes = {
            s.name: ManagedProcess(
                s.name,
                s.argv,
                log_path,
                env=dict(s.env),
                ready=s.readiness,
                grace=5.0,
                foreground=True,
            )
            for s in pool_services(cfg)
        }
        """Every service's process by name, in start order."""

    def start(self, timeout: float = START_TIMEOUT_S) -> MasterProcess:
        self.stop()
        if self.log_path is not None:
            self.log_path.write_bytes(b"")
        super().start(timeout)
        return self
