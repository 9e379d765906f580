"""``kvserve worker`` with kvserve's own engine: the engine built, warmed up and served as a
cluster worker (:mod:`workers.serve.serving`, which has the rest of the lifecycle).

Lifecycle:

1. :func:`workers.serve.serving.admitted` (the registry and TLS settings let this worker in);
   load the model and size the KV cache (:class:`workers.engine.engine.Engine`), join the KV pool
   (a pool that cannot be joined is logged: a ``mixed`` worker serves without it, the other
   roles refuse to start); run one throwaway request (:func:`workers.engine.warmup.warm_up`);
2. start the engine thread (:class:`workers.engine.loop.EngineLoop`) and hand the engine's
   parts to :func:`workers.serve.serving.run_worker`: its record (its KV contract), its servicer,
   its load reports and its KV event publisher (attached to the engine's block pool before
   the engine thread owns it: the first batch is a snapshot of the cache);
3. on the way out the engine thread stops, then the engine closes (it leaves the pool).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace
from pathlib import Path

from kvpool.config import PoolConfig
from proto.registry import ClusterConfig, WorkerRecord
from workers.config import EngineConfig, WorkerConfig
from workers.engine.engine import Engine
from workers.engine.loop import EngineLoop
from workers.engine.warmup import warm_up
from workers.handoff.pool_transfer import layout_of, pool_index
from workers.serve.kv_publisher import EventPublisher
from workers.serve.metrics_http import WorkerSample
from workers.serve.servicer import WorkerServicer
from workers.serve.serving import ServingParts, admitted, advertised, run_worker
from workers.serve.wire import load_report

log = logging.getLogger(__name__)


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


def serve(
    worker: WorkerConfig, engine_config: EngineConfig, pool: PoolConfig, cluster: ClusterConfig
) -> int:
    """Run a worker until SIGTERM/SIGINT; returns the exit code."""
    if not admitted(cluster):
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


async def _serve(worker: WorkerConfig, engine: Engine, cluster: ClusterConfig) -> int:
    record = make_record(worker, engine, advertised(worker))
    events = EventPublisher(cluster, record.worker_id, record.started_at)
    events.attach(engine.scheduler.blocks.pool)  # before the engine thread owns the pool
    loop = EngineLoop(engine, on_round=lambda e: events.collect(e.scheduler.blocks.pool))
    servicer = WorkerServicer(loop, worker.role, lambda: None)

    def sample(timeout: float) -> WorkerSample:
        load = loop.call(lambda e: e.load()).result(timeout=timeout)
        report = load_report(load, servicer.role, servicer.draining)
        return WorkerSample(report, load.stats.preemptions, load.stats.queue_time)

    async def stop() -> None:
        loop.stop()

    loop.start()
    return await run_worker(worker, cluster, ServingParts(record, servicer, sample, events, stop))
