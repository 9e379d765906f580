"""Serving one engine as a cluster worker, whatever the engine (ours: :mod:`workers.serve.server`;
vLLM's: ``vllm_backend.server``): what comes before and after the engine's own parts.

Lifecycle (:func:`admitted` before the engine is built, :func:`run_worker` once it is):

1. :func:`admitted`: the registry (Redis) lets this worker in (credentials, ACL; an
   unreachable Redis passes: the first heartbeat reports it) and the TLS settings can
   serve; a refusal stops the worker before a model is loaded;
2. :func:`run_worker`: the gRPC server (the engine's ``Worker`` servicer and the standard
   health service, NOT_SERVING yet; keepalive and TLS from :mod:`proto.channels`) and,
   when asked, ``/metrics`` (:mod:`workers.serve.metrics_http`); the port is open before the
   record is out, so a router that reads the record connects at once. The record's first
   beat checks the worker's KV contract against the cluster's: a mismatch stops the
   worker with the reason. Then health SERVING, the heartbeat thread and the KV event
   publisher (:mod:`workers.serve.kv_publisher`);
3. on SIGTERM or SIGINT: health NOT_SERVING, withdraw the record, stop accepting RPCs and
   give running ones a grace period, then the engine's own stop and the event publisher.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace

import redis
from google.protobuf.json_format import MessageToDict
from grpc_health.v1 import _async as health_aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

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
from workers.config import WorkerConfig
from workers.serve.kv_publisher import EventPublisher
from workers.serve.metrics_http import WorkerCollector, WorkerSample, serve_metrics
from workers.serve.registration import Heartbeat
from workers.serve.servicer_base import ServicerBase

log = logging.getLogger(__name__)
GRACE_S = 5.0
REPORT_WAIT_S = 5.0
"""A load report for ``/metrics`` waits this long for the engine."""


def advertised(worker: WorkerConfig) -> str:
    """The ``host:port`` others reach this worker at."""
    if worker.worker_advertise:
        return worker.worker_advertise
    host = worker.worker_host
    if host in ("0.0.0.0", "::", ""):
        host = socket.gethostname()
    return f"{host}:{worker.worker_port}"


def admitted(cluster: ClusterConfig) -> bool:
    """Step 1: whether Redis accepts this worker's credentials and its TLS settings can
    serve (each refusal logged)."""
    try:
        channels.server_credentials(cluster)
    except ValueError as exc:
        log.error("%s", exc)
        return False
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


@dataclass
class ServingParts:
    """An engine's parts :func:`run_worker` needs: its ``record`` (unpublished), its
    ``servicer``, ``sample(timeout)`` (its load report now, within ``timeout`` seconds;
    from any thread), its KV ``events`` publisher (attached to its cache, not started) and
    ``stop`` (the engine's own shutdown, after the server stopped)."""

    record: WorkerRecord
    servicer: ServicerBase
    sample: Callable[[float], WorkerSample]
    events: EventPublisher
    stop: Callable[[], Awaitable[None]]


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


async def run_worker(worker: WorkerConfig, cluster: ClusterConfig, parts: ServingParts) -> int:
    """Steps 2 and 3 of the module docstring; the exit code."""
    record, servicer = parts.record, parts.servicer

    def load() -> dict[str, object]:  # bounded by the beat: see workers.serve.registration
        return MessageToDict(parts.sample(cluster.heartbeat_s).report,
                             preserving_proto_field_name=True)  # fmt: skip

    heartbeat = Heartbeat(cluster, record, load)

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
                record.worker_id,
                record.model,
                lambda: parts.sample(REPORT_WAIT_S),
                role=lambda: servicer.role,
            )
            metrics = serve_metrics(worker.worker_host, worker.worker_metrics_port, collector)
        except OSError as exc:
            log.error("cannot serve /metrics on port %d: %s", worker.worker_metrics_port, exc)
            await parts.stop()
            return 1
    server = channels.server(cluster, record.address)
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
        await parts.stop()
        parts.events.stop()
        return 1
    await health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    heartbeat.start()
    parts.events.start()
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
    await parts.stop()
    parts.events.stop()
    return 0
