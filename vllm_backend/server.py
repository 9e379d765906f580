"""``kvserve worker --engine vllm``: vLLM's engine served as a cluster worker (run inside
vLLM's environment: :func:`kvserve.vllm_env.enter` re-executed the command there).

Lifecycle:

1. (before this module is imported: :func:`vllm_backend.preflight.may_start`, the pool on,
   the registry and TLS settings letting this worker in, and the pool's master answering
   where the role needs the pool) the KV namespace and wire layout from the model
   directory, as our engine computes them (so a vLLM worker and ours share blocks when
   model, dtype and block size agree: their KV contracts are equal);
2. a private directory (mode 0700) for the connector's spec (:mod:`vllm_backend.spec`,
   with the cluster's keys) and two ``ipc://`` sockets: the connector's reports
   (:class:`vllm_backend.inbox.ReportInbox` into :class:`vllm_backend.state.WorkerState`)
   and vLLM's KV events (:class:`vllm_backend.event_feed.EventFeed` into the worker's
   event publisher, under our block names);
3. vLLM's engine (:class:`vllm_backend.engine.VllmEngine`; the connector joins the pool in
   vLLM's processes and refuses a cache whose wire layout is not the contract's: vLLM then
   fails to start and so does the worker); the spec file is removed once it is up; one
   throwaway request warms it;
4. :func:`workers.serve.serving.run_worker` with the record, the servicer
   (:class:`vllm_backend.servicer.VllmServicer`), the load reports and the event publisher;
   on the way out: the event feed, vLLM's engine, the report inbox, the directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import os
import shutil
import socket
import tempfile
import time
from pathlib import Path

from kvpool.config import PoolConfig
from kvpool.hashing import Namespace, PrefixHasher
from kvpool.layout import KVLayout
from proto.registry import ClusterConfig, WorkerRecord
from proto.tokenization import Tokenizer
from vllm_backend.args import cpu_binding, engine_kwargs, sampling_kwargs
from vllm_backend.cache_names import CacheNames
from vllm_backend.engine import VllmEngine
from vllm_backend.event_feed import EventFeed
from vllm_backend.inbox import ReportInbox
from vllm_backend.preflight import NO_POOL, needs_pool
from vllm_backend.servicer import VllmServicer
from vllm_backend.spec import ConnectorSpec
from vllm_backend.state import WorkerState
from workers.config import EngineConfig, VllmOptions, WorkerConfig
from workers.core.sequence import SamplingParams
from workers.model.config import load_model_config
from workers.model.loader import model_fingerprint
from workers.model.prepare import resolve_model_dir
from workers.serve.kv_publisher import EventPublisher
from workers.serve.metrics_http import WorkerSample
from workers.serve.serving import ServingParts, advertised, run_worker
from workers.serve.wire import load_report

log = logging.getLogger(__name__)
WARMUP_TOKENS = 8
JOIN_WAIT_S = 10.0
"""Longest wait, once vLLM is up, for its worker side's ``joined`` report (it was sent
while vLLM started, so it is normally in already)."""


def serve(
    worker: WorkerConfig,
    engine: EngineConfig,
    options: VllmOptions,
    pool: PoolConfig,
    cluster: ClusterConfig,
) -> int:
    """Run a vLLM-backed worker that passed :func:`vllm_backend.preflight.may_start` until
    SIGTERM/SIGINT; returns the exit code."""
    private = Path(tempfile.mkdtemp(prefix="kvserve-vllm-"))
    try:
        return asyncio.run(_serve(worker, engine, options, pool, cluster, private))
    except ValueError as exc:
        log.error("cannot serve with vLLM: %s", exc)
        return 1
    finally:
        shutil.rmtree(private, ignore_errors=True)


def _bind_threads(engine: EngineConfig) -> None:
    """vLLM's device and threads: on a CPU its threads bound to this process's cores
    (:func:`vllm_backend.args.cpu_binding`); ``cuda:N`` makes GPU N the only one vLLM
    sees."""
    if engine.device == "cpu":
        os.environ.update(cpu_binding(os.sched_getaffinity(0), engine.threads))
    elif ":" in engine.device:
        os.environ["CUDA_VISIBLE_DEVICES"] = engine.device.split(":", 1)[1]


async def _serve(
    worker: WorkerConfig,
    engine_config: EngineConfig,
    options: VllmOptions,
    pool: PoolConfig,
    cluster: ClusterConfig,
    private: Path,
) -> int:
    model_dir = resolve_model_dir(engine_config.model)
    model = load_model_config(model_dir)
    keyring, bt = cluster.keyring, engine_config.block_tokens
    namespace = Namespace(
        f"{model_dir.name}@{model_fingerprint(model_dir)}",
        engine_config.dtype,
        bt,
        algorithm=keyring.algorithm,
    )
    wire = KVLayout(
        model.num_layers, 1, bt, model.num_kv_heads, model.head_dim, engine_config.dtype
    ).wire
    reports, events_at = f"ipc://{private}/reports", f"ipc://{private}/events"
    writer = f"{socket.gethostname()}-{os.getpid()}-vllm"
    spec_file = ConnectorSpec(pool, cluster, namespace, wire, reports, writer).save(
        private / "spec.json"
    )
    state = WorkerState(0)
    inbox = ReportInbox(reports, state.handle)
    inbox.start()
    address, now = advertised(worker), time.time()
    worker_id = worker.worker_id or address.replace(":", "-")
    events = EventPublisher(cluster, worker_id, now)
    hasher = PrefixHasher(namespace, keyring.prefix_root)
    names = CacheNames(hasher, bt)
    events.attach(names)
    feed = EventFeed(events_at, names, events)
    feed.start()
    _bind_threads(engine_config)
    kwargs = engine_kwargs(engine_config, options, model_dir, spec_file, events_at)
    engine = VllmEngine.start(kwargs, state)
    spec_file.unlink()

    async def stop() -> None:
        await feed.stop()
        engine.shutdown()
        await inbox.stop()

    if not await state.joined(JOIN_WAIT_S) and needs_pool(worker):
        log.error(NO_POOL, worker.role)
        await stop()
        return 1
    max_model_len = int(engine.llm.vllm_config.model_config.max_model_len)
    await _warm_up(engine)
    record = WorkerRecord(
        worker_id=worker_id,
        address=address,
        role=worker.role,
        model=model_dir.name,
        model_dir=str(model_dir),
        contract=f"{namespace.key}|{wire}",
        block_tokens=bt,
        num_layers=model.num_layers,
        max_model_len=max_model_len,
        started_at=now,
        heartbeat_at=now,
    )
    servicer = VllmServicer(
        engine,
        state,
        names,
        hasher,
        Tokenizer(model_dir, lazy=True),
        worker.role,
        max_model_len,
        bt,
    )

    aio = asyncio.get_running_loop()

    def snapshot() -> WorkerSample:  # on the event loop, which owns the state
        report = load_report(servicer.load(), servicer.role, servicer.draining)
        return WorkerSample(report, state.stats.preemptions, copy.deepcopy(state.stats.queue_time))

    async def on_loop() -> WorkerSample:
        return snapshot()

    def sample(timeout: float) -> WorkerSample:  # the heartbeat's and /metrics' threads too
        with contextlib.suppress(RuntimeError):
            if asyncio.get_running_loop() is aio:
                return snapshot()
        return asyncio.run_coroutine_threadsafe(on_loop(), aio).result(timeout)

    parts = ServingParts(record, servicer, sample, events, stop)
    return await run_worker(worker, cluster, parts)


async def _warm_up(engine: VllmEngine) -> None:
    """One throwaway request shorter than a block (nothing for the pool)."""
    params = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
    sampling = sampling_kwargs(params, 2, 0, {})
    async for _ in engine.run("kvserve-warmup", list(range(1, WARMUP_TOKENS + 1)), "", sampling):
        pass
