"""gRPC transport against real processes: TLS and mutual TLS, and a frozen peer (SIGSTOP:
its kernel still ACKs TCP, it answers no HTTP/2 PING) failing an in-flight stream within
about ``peer_timeout_s`` instead of hanging.

A small health server built by :mod:`proto.channels` (as a worker builds its own) covers
the options; one real ``kvserve worker`` on the tiny model covers the wiring end to end.
Certificates are throwaway ones made with the ``openssl`` CLI in a temp dir.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from kvpool.master import MasterConfig
from kvpool.net import free_local_ports
from kvserve.cluster.health import grpc_serving
from kvserve.cluster.pool import MASTER, METADATA, MasterProcess, PoolProcesses
from kvserve.cluster.processes import ManagedProcess
from kvserve.cluster.redis import RedisConfig, RedisProcess
from proto import channels
from proto import worker_pb2 as pb
from proto.registry import ClusterConfig
from proto.worker_pb2_grpc import WorkerStub

ROOT = Path(__file__).resolve().parents[2]
PEER_TIMEOUT_S = 2.0
BOUND_S = 4 * PEER_TIMEOUT_S + 2  # "fails rather than hangs", not a speed assertion
SERVER = """
import asyncio, json, sys
from grpc_health.v1 import _async as health_aio, health_pb2, health_pb2_grpc
from proto import channels
from proto.registry import ClusterConfig

async def main() -> None:
    cluster = ClusterConfig(**json.loads(sys.argv[1]))
    bound = []  # router tokens are addressed to the port it binds
    server = channels.server(cluster, lambda: bound[0])
    health = health_aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    port = channels.add_port(server, "127.0.0.1:0", cluster)
    bound.append(f"127.0.0.1:{port}")
    await server.start()
    await health.set("", health_pb2.HealthCheckResponse.SERVING)
    print(port, flush=True)
    await server.wait_for_termination()

asyncio.run(main())
"""
SERVING = health_pb2.HealthCheckResponse.SERVING


@dataclass(frozen=True)
class Certs:
    ca: str
    worker: tuple[str, str]  # (cert, key)
    router: tuple[str, str]

    def worker_side(self, mutual: bool = True) -> dict[str, str]:
        cert, key = self.worker
        return {
            "grpc_tls_cert": cert,
            "grpc_tls_key": key,
            "grpc_tls_ca": self.ca if mutual else "",
        }

    def router_side(self, with_cert: bool = True) -> ClusterConfig:
        cert, key = self.router if with_cert else ("", "")
        return ClusterConfig(grpc_tls_cert=cert, grpc_tls_key=key, grpc_tls_ca=self.ca)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    if shutil.which("openssl") is None:
        pytest.skip("the openssl CLI is needed to make test certificates")
    d = tmp_path_factory.mktemp("certs")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True, timeout=60)

    openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
            "-subj", "/CN=kvserve-test-ca")  # fmt: skip
    (d / "leaf.cnf").write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n"
        "extendedKeyUsage=serverAuth,clientAuth\nkeyUsage=digitalSignature\n"
    )
    for name in ("worker", "router"):
        openssl("req", "-new", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr",
                "-subj", f"/CN={name}")  # fmt: skip
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                "-CAcreateserial", "-out", f"{name}.pem", "-days", "2",
                "-extfile", "leaf.cnf")  # fmt: skip

    def pair(name: str) -> tuple[str, str]:
        return str(d / f"{name}.pem"), str(d / f"{name}.key")

    return Certs(str(d / "ca.pem"), pair("worker"), pair("router"))


@contextmanager
def health_server(**settings: object) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """A health-service server from :mod:`proto.channels` in its own process."""
    argv = [sys.executable, "-c", SERVER, json.dumps(settings)]
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        port = proc.stdout.readline().strip()
        assert port.isdigit(), f"health server did not start (exit {proc.poll()})"
        yield proc, f"127.0.0.1:{port}"
    finally:
        resume_and_kill(proc.pid)
        proc.wait(30)


def resume_and_kill(pid: int) -> None:
    for sig in (signal.SIGCONT, signal.SIGKILL):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return


def health(address: str, cluster: ClusterConfig) -> int:
    with channels.sync_channel(address, cluster) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=20
        )
    return int(reply.status)


def refused(address: str, cluster: ClusterConfig) -> bool:
    try:
        health(address, cluster)
    except grpc.RpcError as exc:
        return exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
    return False


@pytest.mark.timeout(120)
def test_mutual_tls(certs: Certs) -> None:
    with health_server(**certs.worker_side()) as (_, address):
        assert health(address, certs.router_side()) == SERVING
        assert grpc_serving(address, certs.router_side(), timeout=20)  # the launcher's check
        assert refused(address, ClusterConfig())  # plaintext
        assert refused(address, certs.router_side(with_cert=False))  # TLS, no client cert
        assert not grpc_serving(address, ClusterConfig())


@pytest.mark.timeout(120)
def test_a_peer_slow_to_answer_a_new_connection_is_waited_for() -> None:
    """A peer that takes longer than the redial backoff (at most 1 s) to answer a new
    connection (here frozen for 3 s as the client dials, as a saturated machine can keep a
    busy worker) is still reached: each attempt is given the peer timeout (5 s by
    default) to complete. A connect timeout of the backoff's 0.1-1 s took busy workers for
    unreachable ones ("connect() timed out" in loaded suite runs)."""
    with health_server() as (proc, address):
        os.kill(proc.pid, signal.SIGSTOP)
        thaw = threading.Timer(3.0, os.kill, (proc.pid, signal.SIGCONT))
        thaw.start()
        try:
            assert health(address, ClusterConfig()) == SERVING
        finally:
            thaw.cancel()
            os.kill(proc.pid, signal.SIGCONT)


@pytest.mark.timeout(120)
def test_server_only_tls(certs: Certs) -> None:
    with health_server(**certs.worker_side(mutual=False)) as (_, address):
        assert health(address, certs.router_side(with_cert=False)) == SERVING
        assert refused(address, ClusterConfig())


async def stream_fails_when_frozen(stream: grpc.aio.UnaryStreamCall, pid: int) -> grpc.StatusCode:  # type: ignore[type-arg]
    """Read one message, SIGSTOP ``pid``, then read on: the stream must fail (buffered
    messages may still arrive) within :data:`BOUND_S`; returns the status code."""
    messages = aiter(stream)
    await anext(messages)
    os.kill(pid, signal.SIGSTOP)

    async def drain() -> grpc.StatusCode:
        try:
            async for _ in messages:
                pass
        except grpc.aio.AioRpcError as exc:
            return exc.code()
        raise AssertionError("the stream ended normally: the peer was not frozen in time")

    try:
        return await asyncio.wait_for(drain(), BOUND_S)
    except TimeoutError:
        raise AssertionError(f"a call to a frozen peer still hangs after {BOUND_S}s") from None


FAILED = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


@pytest.mark.timeout(120)
def test_frozen_peer_fails_an_in_flight_stream() -> None:
    cluster = ClusterConfig(peer_timeout_s=PEER_TIMEOUT_S)
    with health_server(peer_timeout_s=PEER_TIMEOUT_S) as (proc, address):

        async def scenario() -> grpc.StatusCode:
            async with channels.channel(address, cluster) as channel:
                watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest())
                return await stream_fails_when_frozen(watch, proc.pid)

        assert asyncio.run(scenario()) in FAILED


@pytest.mark.timeout(300)
def test_real_worker_over_mutual_tls_and_frozen(
    certs: Certs, tiny_model_dir: Path, tmp_path: Path
) -> None:
    (redis_port, port) = free_local_ports(2)
    router = ClusterConfig(
        redis_url=f"redis://127.0.0.1:{redis_port}/0",
        peer_timeout_s=PEER_TIMEOUT_S,
        grpc_tls_ca=certs.ca,
        grpc_tls_cert=certs.router[0],
        grpc_tls_key=certs.router[1],
    )
    tls = [f"--{k.replace('_', '-')}={v}" for k, v in certs.worker_side().items()]
    argv = [sys.executable, "-m", "kvserve", "worker", "--no-use-pool", "--role", "mixed",
            "--model", str(tiny_model_dir), "--worker-port", str(port), "--kv-cache-mib", "16",
            "--block-tokens", "16", "--threads", "1", "--redis-url", router.redis_url,
            "--peer-timeout-s", str(PEER_TIMEOUT_S), *tls]  # fmt: skip
    address = f"127.0.0.1:{port}"
    with RedisProcess(RedisConfig(port=redis_port), tmp_path / "redis.log"):
        worker = ManagedProcess("worker", argv, tmp_path / "worker.log").start()
        try:
            while not grpc_serving(address, router, timeout=5):
                assert worker.running, worker.log_tail()
            assert not grpc_serving(address, ClusterConfig())  # plaintext is refused

            async def scenario() -> grpc.StatusCode:
                params = pb.SamplingParams(max_tokens=2000, temperature=0, ignore_eos=True)
                request = pb.GenerateRequest(request_id="r", prompt_token_ids=[5, 6], params=params)
                async with channels.channel(address, router) as channel:
                    stream = WorkerStub(channel).Generate(request)
                    return await stream_fails_when_frozen(stream, worker.pid or 0)

            assert asyncio.run(scenario()) in FAILED
        finally:
            if worker.pid is not None:
                os.kill(worker.pid, signal.SIGCONT)
            worker.stop(10)


def read_link(fd: Path) -> str | None:
    """Where the descriptor ``fd`` of ``/proc/<pid>/fd`` points; None once it is closed."""
    try:
        return str(fd.readlink())
    except FileNotFoundError:
        return None


def listening(pid: int) -> list[str]:
    """``ip:port`` of every TCP socket process ``pid`` listens on (from ``/proc``; a
    descriptor closed while they are read is skipped: it is no listening socket)."""
    links = [link for fd in Path(f"/proc/{pid}/fd").iterdir() if (link := read_link(fd))]
    inodes = {link[8:-1] for link in links if link.startswith("socket:[")}
    found = []
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            local, state, inode = line.split()[1], line.split()[3], line.split()[9]
            if state == "0A" and inode in inodes:  # 0A: LISTEN
                ip, port = local.split(":")
                raw = bytes.fromhex(ip)
                words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
                family = socket.AF_INET if len(raw) == 4 else socket.AF_INET6
                found.append(f"{socket.inet_ntop(family, words)}:{int(port, 16)}")
    return sorted(found)


@pytest.mark.timeout(120)
def test_mooncake_master_listens_on_loopback_only(tmp_path: Path) -> None:
    """Every listening socket of the pool's services, as ``kvserve up`` (PoolProcesses) and
    ``kvserve pool`` (MasterProcess) run them, is on the configured host: the master's own
    metadata server (0.0.0.0 whatever it is told, in 0.3.13) is off, the standalone one
    binds where it is told."""
    rpc, meta, metrics = free_local_ports(3)
    cfg = MasterConfig(master_port=rpc, master_metadata_port=meta, master_metrics_port=metrics)
    expected = {
        METADATA: {f"127.0.0.1:{meta}"},
        MASTER: {f"127.0.0.1:{rpc}", f"127.0.0.1:{metrics}"},
    }
    pool = PoolProcesses(cfg, tmp_path)
    try:
        pool.start()
        found = {name: set(listening(p.pid or 0)) for name, p in pool.processes.items()}
    finally:
        pool.stop(10)
    assert found == expected
    with MasterProcess(cfg, tmp_path / "pool.log") as both:
        found = {name: set(listening(pid)) for name, pid in both.pids.items()}
    assert found == expected
