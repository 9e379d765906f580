"""``kvserve worker``: one engine served over gRPC and registered in the cluster.

Lifecycle:

1. check that the registry (Redis) lets this worker in (credentials, ACL): a refusal stops
   the worker at once, naming the setting to change, before the model is loaded;
   load the model and size the KV cache (:class:`workers.engine.Engine`), join the KV pool
   (a pool that cannot be joined is logged: a ``mixed`` worker serves without it, the other
   roles refuse to start); run one throwaway request (:func:`workers.warmup.warm_up`);
2. start the engine thread and the gRPC server (``Worker`` and the standard health
   service, NOT_SERVING yet; keepalive and TLS from :mod:`proto.channels`);
3. check the worker's KV contract against the cluster's and publish its record (Redis):
   a mismatch stops the worker with the reason. The port is open before the record is
   out: a router that reads the record connects at once (a router that tried a port not
   yet open would back off, and fail calls meanwhile). Then health SERVING, the
   heartbeat thread and the KV event publisher (:mod:`workers.kv_publisher`: its first
   batch is a snapshot of the cache);
4. on SIGTERM or SIGINT: health NOT_SERVING, withdraw the record, stop accepting RPCs and
   give running ones a grace period, stop the engine thread and the event publisher,
   leave the pool.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import time
from dataclasses import replace
from pathlib import Path

import redis
from google.protobuf.json_format import MessageToDict
from grpc_health.v1 import _async as health_aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from kvpool.chain_index import ChainIndex
from kvpool.config import PoolConfig
from proto import channels, worker_pb2_grpc
from proto.registry import (
    ClusterConfig,
    ContractMismatchError,
    RegistryAccessError,
    WorkerRecord,
    check,
    connect,
    explain,
)
from workers.config import EngineConfig, WorkerConfig
from workers.engine import Engine
from workers.engine_loop import EngineLoop
from workers.kv_publisher import EventPublisher
from workers.kv_transfer import layout_of
from workers.metrics_http import WorkerCollector, WorkerSample, serve_metrics
from workers.registration import Heartbeat
from workers.servicer import WorkerServicer
from workers.warmup import warm_up
from workers.wire import load_report

log = logging.getLogger(__name__)
GRACE_S = 5.0
REPORT_WAIT_S = 5.0  # a load report for /metrics waits this long for the engine thread


def advertised(worker: WorkerConfig) -> str:
    if worker.worker_advertise:
        return worker.worker_advertise
    host = worker.worker_host
    if host in ("0.0.0.0", "::", ""):
        host = socket.gethostname()
    return f"{host}:{worker.worker_port}"


def make_record(worker: WorkerConfig, engine: Engine, address: str) -> WorkerRecord:
    layout = layout_of(engine.runner.kv, engine.config.dtype)
    now = time.time()
    return WorkerRecord(
        worker_id=worker.worker_id or address.replace(":", "-"),
        address=address,
        role=worker.role,
        model=engine.model_dir.name,
        model_dir=str(engine.model_dir),
        contract=f"{engine.namespace.key}|{layout.wire}",
        block_tokens=engine.config.block_tokens,
        num_layers=engine.model_config.num_layers,
        max_model_len=engine.max_model_len,
        started_at=now,
        heartbeat_at=now,
    )


INDEX_TIMEOUT_S = 1.0
"""The longest a chain-index call may hold the engine thread (a frozen Redis)."""


def pool_index(cluster: ClusterConfig) -> ChainIndex:
    """The pool's chain index in the cluster's Redis (chain-aware eviction), under the
    cluster's key prefix."""
    client = connect(cluster, INDEX_TIMEOUT_S, INDEX_TIMEOUT_S, retry=False)
    return ChainIndex(client, f"{cluster.cluster}:pool")


def serve(
    worker: WorkerConfig, engine_config: EngineConfig, pool: PoolConfig, cluster: ClusterConfig
) -> int:
    """Run a worker until SIGTERM/SIGINT; returns the exit code."""
    if not registry_admits(cluster):
        return 1
    try:
        channels.server_credentials(cluster)  # a TLS setting that cannot serve fails here
    except ValueError as exc:
        log.error("%s", exc)
        return 1
    if engine_config.step_log_dir:  # one folder per starting role: costs differ by role
        folder = str(Path(engine_config.step_log_dir) / worker.role)
        engine_config = replace(engine_config, step_log_dir=folder)
    index = pool_index(cluster) if worker.use_pool and pool.pool_eviction == "chain" else None
    engine = Engine(engine_config, pool if worker.use_pool else None, cluster.keyring, index)
    try:
        if worker.role != "mixed" and not engine.info.pool_attached:
            log.error("the %s role needs the KV pool, which could not be joined", worker.role)
            return 1
        warm_up(engine)  # before registering: the first request pays no one-off costs
        return asyncio.run(_serve(worker, engine, cluster))
    finally:
        engine.close()


def registry_admits(cluster: ClusterConfig) -> bool:
    """Whether Redis accepts this worker's credentials (an unreachable Redis passes: the
    first heartbeat, after the model is loaded, reports it)."""
    client = connect(cluster, socket_timeout=cluster.heartbeat_ttl_s, socket_connect_timeout=1.0)
    try:
        check(client, cluster)
    except RegistryAccessError as exc:
        log.error("cannot join cluster %r: %s", cluster.cluster, exc)
        return False
    except (redis.RedisError, OSError):
        pass
    finally:
        client.close()
    return True


def _join(heartbeat: Heartbeat, cluster: ClusterConfig) -> str | None:
    """Publish the worker's record the first time (its KV contract checked against the
    cluster's); why it could not be, or None."""
    try:
        heartbeat.beat()
    except (ContractMismatchError, RegistryAccessError) as exc:
        return str(exc)
    except (redis.RedisError, OSError) as exc:
        return explain(cluster, exc)
    return None


async def _serve(worker: WorkerConfig, engine: Engine, cluster: ClusterConfig) -> int:
    record = make_record(worker, engine, advertised(worker))
    events = EventPublisher(cluster, record.worker_id, record.started_at)
    events.attach(engine.scheduler.blocks.pool)  # before the engine thread owns the pool
    loop = EngineLoop(engine, on_round=lambda e: events.collect(e.scheduler.blocks.pool))
    servicer = WorkerServicer(loop, worker.role, lambda: None)

    def sample(timeout: float = REPORT_WAIT_S) -> WorkerSample:
        load = loop.call(lambda e: e.load()).result(timeout=timeout)
        report = load_report(load, servicer.role, servicer.draining)
        return WorkerSample(report, load.stats.preemptions, load.stats.queue_time)

    def load() -> dict[str, object]:  # bounded by the beat: see workers.registration
        return MessageToDict(sample(cluster.heartbeat_s).report, preserving_proto_field_name=True)

    heartbeat = Heartbeat(cluster, record, load)
    loop.start()

    def republish() -> None:  # a role or drain change is visible at once, not a beat later
        heartbeat.record = replace(heartbeat.record, role=servicer.role)
        try:
            heartbeat.beat()
        except (redis.RedisError, OSError, RegistryAccessError) as exc:
            log.warning("could not publish the role change now: %s", explain(cluster, exc))

    servicer.on_change = republish
    metrics = None
    if worker.worker_metrics_port:
        try:
            collector = WorkerCollector(
                record.worker_id, record.model, sample, role=lambda: servicer.role
            )
            metrics = serve_metrics(worker.worker_host, worker.worker_metrics_port, collector)
        except OSError as exc:
            log.error("cannot serve /metrics on port %d: %s", worker.worker_metrics_port, exc)
            loop.stop()
            return 1
    server = channels.server(cluster)
    worker_pb2_grpc.add_WorkerServicer_to_server(servicer, server)
    health_servicer = health_aio.HealthServicer()
    await health_servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    channels.add_port(server, f"{worker.worker_host}:{worker.worker_port}", cluster)
    await server.start()  # listening before the record is published: see the docstring
    failure = _join(heartbeat, cluster)
    if failure is not None:
        log.error("cannot join cluster %r: %s", cluster.cluster, failure)
        await server.stop(None)
        if metrics is not None:
            metrics.shutdown()
        loop.stop()
        events.stop()
        return 1
    await health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    heartbeat.start()
    events.start()
    log.info(
        "worker %s (%s) serving on %s (%s)",
        record.worker_id,
        worker.role,
        record.address,
        "TLS" if cluster.grpc_tls else "plaintext",
    )
    stop = asyncio.Event()
    aio = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        aio.add_signal_handler(sig, stop.set)
    await stop.wait()
    await health_servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
    heartbeat.stop()
    if metrics is not None:
        metrics.shutdown()
    await server.stop(GRACE_S)
    loop.stop()
    events.stop()
    return 0
