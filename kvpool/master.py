"""Starting and stopping a ``mooncake_master`` (the binary from the Mooncake wheel).

The master keeps the pool's metadata (which object lives in which member's segment),
evicts under memory pressure and, here, also serves the transfer engine's HTTP metadata.
Every listening service binds to ``host`` (127.0.0.1 by default): the metadata and REST
services of this Mooncake version are unauthenticated, so binding them to a public
interface is an explicit operator choice.

Lifecycle of :class:`MasterProcess`: ``start()`` spawns the binary and waits until its RPC
and metadata ports accept connections (or raises with the binary's output) -> the pool is
usable -> ``stop()`` terminates it (SIGTERM, then SIGKILL after a grace period).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType


@dataclass(frozen=True)
class MasterConfig:
    """Flags of ``kvserve pool`` (env ``KVSERVE_MASTER_*``).

    - ``master_host``: address every service binds to (loopback unless asked otherwise).
    - ``master_port`` / ``master_metadata_port`` / ``master_metrics_port``: RPC, HTTP
      metadata server and metrics/admin server.
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


def master_binary() -> Path:
    """The ``mooncake_master`` next to this interpreter, or on ``PATH``."""
    local = Path(sys.executable).parent / "mooncake_master"
    found = local if local.is_file() else shutil.which("mooncake_master")
    if not found:
        raise FileNotFoundError(
            "mooncake_master not found: run scripts/setup.sh (it installs the Mooncake wheel)"
        )
    return Path(found)


def master_command(cfg: MasterConfig) -> list[str]:
    return [
        str(master_binary()),
        f"--rpc_address={cfg.master_host}",
        f"--rpc_port={cfg.master_port}",
        "--enable_http_metadata_server=true",
        f"--http_metadata_server_host={cfg.master_host}",
        f"--http_metadata_server_port={cfg.master_metadata_port}",
        f"--metrics_host={cfg.master_host}",
        f"--metrics_port={cfg.master_metrics_port}",
        f"--client_ttl={cfg.master_client_ttl_s}",
        f"--eviction_high_watermark_ratio={cfg.master_eviction_high_watermark}",
        f"--eviction_ratio={cfg.master_eviction_ratio}",
    ]


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
    def __init__(self, cfg: MasterConfig, log_path: Path | None = None) -> None:
        self.cfg = cfg
        self.log_path = log_path
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 20.0) -> MasterProcess:
        """Spawn the master (its output goes to ``log_path``, or to ours if none)."""
        log = self.log_path.open("wb") if self.log_path else None
        self._proc = subprocess.Popen(master_command(self.cfg), stdout=log, stderr=log)
        deadline = time.monotonic() + timeout
        ports = (self.cfg.master_port, self.cfg.master_metadata_port)
        while not all(port_open(self.cfg.master_host, p) for p in ports):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                where = f"; see {self.log_path}" if self.log_path else ""
                raise RuntimeError(f"mooncake_master did not come up on {ports}{where}")
            time.sleep(0.05)
        return self

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def wait(self) -> int:
        """Block until the master exits; returns its exit code."""
        assert self._proc is not None, "not started"
        return self._proc.wait()

    def terminate(self) -> None:
        """Ask the master to exit without waiting (safe inside a signal handler)."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()

    def stop(self, grace: float = 5.0) -> None:
        if self._proc is None:
            return
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(grace)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None

    def __enter__(self) -> MasterProcess:
        return self.start() if not self.running else self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
