"""Starting and stopping the KV pool's services (both from the Mooncake wheel).

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
names, argv, readiness ports and start order (metadata server, then master; stop in reverse).
:class:`MasterProcess` and :class:`kvserve.cluster.processes.PoolProcesses` both start from it.

Lifecycle of :class:`MasterProcess`: ``start()`` spawns the metadata server and waits until
its port accepts connections, then the master and waits for its RPC and metrics ports (or
stops both and raises naming the log) -> the pool is usable -> ``stop()`` terminates the
master, then the metadata server (SIGTERM, then SIGKILL after a grace period).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import BinaryIO


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
    """

    master_host: str = "127.0.0.1"
    master_port: int = 50051
    master_metadata_port: int = 8080
    master_metrics_port: int = 9003
    master_client_ttl_s: int = 10
    master_eviction_high_watermark: float = 0.9
    master_eviction_ratio: float = 0.05

    def __post_init__(self) -> None:
        if not 0 < self.master_eviction_high_watermark <= 1:
            raise ValueError("master_eviction_high_watermark must be in (0, 1]")
        if not 0 < self.master_eviction_ratio <= 1:
            raise ValueError("master_eviction_ratio must be in (0, 1]")
        if self.master_client_ttl_s < 1:
            raise ValueError("master_client_ttl_s must be at least 1")

    @property
    def rpc_address(self) -> str:
        return f"{self.master_host}:{self.master_port}"

    @property
    def metadata_url(self) -> str:
        return f"http://{self.master_host}:{self.master_metadata_port}/metadata"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.master_host}:{self.master_metrics_port}/metrics"


def wheel_binary(name: str) -> Path:
    """The Mooncake wheel's executable ``name`` next to this interpreter, or on ``PATH``."""
    local = Path(sys.executable).parent / name
    found = local if local.is_file() else shutil.which(name)
    if not found:
        raise FileNotFoundError(
            f"{name} not found: run scripts/setup.sh (it installs the Mooncake wheel)"
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
    ]


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

    def ready(self) -> bool:
        return all(port_open(self.host, p) for p in self.ports)

    def wait_ready(self, running: Callable[[], bool], timeout: float) -> bool:
        """Poll until the service is ready (True), or until ``running()`` says its process
        exited or ``timeout`` seconds passed (False)."""
        deadline = time.monotonic() + timeout
        while not self.ready():
            if not running() or time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

    def check_ports_free(self) -> None:
        """Raise if something already listens on one of the ports: checked before starting,
        as readiness is "the ports answer" and the metadata server does not exit when it
        cannot bind."""
        busy = [p for p in self.ports if port_open(self.host, p)]
        if busy:
            ports = ", ".join(map(str, busy))
            raise RuntimeError(f"{self.name}: port {ports} on {self.host} is already in use")


def pool_services(cfg: MasterConfig) -> tuple[PoolService, ...]:
    """The pool's processes in start order: the metadata server (:data:`METADATA`), then the
    master (:data:`MASTER`). Start each after the previous one is ready; stop in reverse.
    The master alone may be restarted: the metadata server keeps the members' entries and
    they remount their segments at the new master by themselves."""
    return (
        PoolService(
            METADATA, tuple(metadata_command(cfg)), cfg.master_host, (cfg.master_metadata_port,)
        ),
        PoolService(
            MASTER,
            tuple(master_command(cfg)),
            cfg.master_host,
            (cfg.master_port, cfg.master_metrics_port),
        ),
    )


def free_local_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports free on 127.0.0.1 right now (for tests and benchmarks)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def port_open(host: str, port: int, timeout: float = 0.2) -> bool:
    """Whether something accepts TCP connections at ``host:port`` now."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


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


def master_stats(cfg: MasterConfig) -> MasterStats:
    """Parse the master's metrics page into :class:`MasterStats`."""
    from prometheus_client.parser import text_string_to_metric_families

    values: dict[str, float] = {}
    for family in text_string_to_metric_families(read_metrics(cfg)):
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


class MasterProcess:
    """The pool's services (:func:`pool_services`) as children of this process, sharing one
    log file (``log_path``, or our own output if None). See the module docstring for the
    lifecycle; ``stop()`` is idempotent, and also runs when ``start()`` fails.

    The children stay in our process group, so a terminal's Ctrl-C reaches them too."""

    def __init__(self, cfg: MasterConfig, log_path: Path | None = None) -> None:
        self.cfg = cfg
        self.log_path = log_path
        self._procs: dict[str, subprocess.Popen[bytes]] = {}  # in start order
        self._log: BinaryIO | None = None

    def start(self, timeout: float = 20.0) -> MasterProcess:
        """Spawn each service in turn, waiting until it is ready (``timeout`` for each);
        whatever is left of an earlier start is stopped first."""
        self.stop()
        if self.log_path is not None and self._log is None:
            self._log = self.log_path.open("wb")
        try:
            for service in pool_services(self.cfg):
                self._start_one(service, timeout)
        except BaseException:  # also Ctrl-C while starting: nothing is left running
            self.stop()
            raise
        return self

    def _start_one(self, service: PoolService, timeout: float) -> None:
        service.check_ports_free()
        proc = subprocess.Popen(service.argv, stdout=self._log, stderr=self._log)
        self._procs[service.name] = proc
        if not service.wait_ready(lambda: proc.poll() is None, timeout):
            where = f"; see {self.log_path}" if self.log_path else ""
            raise RuntimeError(
                f"{service.name} did not come up on {service.host}:{service.ports}{where}"
            )

    @property
    def pids(self) -> dict[str, int]:
        """Process id of each started service, by name (:data:`METADATA`, :data:`MASTER`)."""
        return {name: proc.pid for name, proc in self._procs.items()}

    @property
    def running(self) -> bool:
        """Whether every service was started and none has exited."""
        return len(self._procs) == len(pool_services(self.cfg)) and all(
            proc.poll() is None for proc in self._procs.values()
        )

    def wait(self) -> int:
        """Block until one of the services exits (the pool is unusable then); returns its
        exit code. The others keep running until :meth:`stop`."""
        assert self._procs, "not started"
        while True:
            for proc in self._procs.values():
                code = proc.poll()
                if code is not None:
                    return code
            time.sleep(0.1)

    def terminate(self) -> None:
        """Ask every service to exit without waiting (safe inside a signal handler)."""
        for proc in self._procs.values():
            if proc.poll() is None:
                proc.terminate()

    def stop(self, grace: float = 5.0) -> None:
        """Terminate the services in reverse start order, each with ``grace`` seconds
        before SIGKILL; idempotent."""
        for name in reversed(list(self._procs)):
            proc = self._procs.pop(name)
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(grace)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> MasterProcess:
        return self.start() if not self.running else self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
