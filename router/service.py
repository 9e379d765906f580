"""The router without HTTP: the workers, the tokenizer, and running an admitted request.

Lifecycle of :class:`RouterService`:

1. built by the app with the three configs, resolving the router's id once
   (:meth:`router.config.RouterConfig.resolved_router_id`: responses, metrics, cache
   statistics and the controller's lease carry it); ``start()`` starts joining the pool as a
   lookup client (optional, in the background), the KV event reader that keeps the
   per-worker prefix index (:mod:`router.placement.kv_index`; each registry poll syncs it with the
   live workers), the worker view (first registry poll included) and, with
   ``--controller``, the P:D ratio controller;
2. per request, before any worker is called, :mod:`router.api.prepare` checks it against
   :meth:`serving`, :meth:`model_name`, :meth:`max_model_len` and :meth:`tokenizer`
   (loaded once from ``tokenizer_dir``, the router's own setting: never from a path read
   from the registry; 503 without one);
3. :meth:`run` places the admitted request (:class:`router.flow.plan.Planner`: pool lookup,
   local hits from the prefix index, conductor placement; 503 when nobody can serve; 429
   with ``Retry-After`` when admission control predicts too late a first token) and runs it
   as a :class:`router.flow.run.RequestFlow`; its chunks report to the shared metrics and cache
   stats, and its result to the controller's SLO window. Flows share one queue for KV memory
   (:mod:`router.placement.kv_wait`): a request whose decode reservation finds no free pages waits
   there, and a registry poll that brings fresh load reports wakes it to try again;
4. ``stop()`` ends the controller, the worker view and the event reader, and leaves the
   pool.

Every worker record used here (model name, ``max_model_len``, load, pool key space) has
passed the registry's MAC and schema checks (:mod:`router.placement.worker_view`); the refused ones
are counted in ``kvserve:registry_rejected_records_total``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path

from kvpool.config import PoolConfig
from proto.registry import ClusterConfig, Rejection
from proto.tokenization import Tokenizer
from router.config import RouterConfig
from router.control.controller import RoleController
from router.control.lease import ControllerLease, lease_ttl_s
from router.errors import unavailable
from router.flow.admitted import AdmittedRequest
from router.flow.plan import Planner
from router.flow.run import RequestFlow
from router.flow.tokenizer import TokenizerSlot
from router.flow.types import Chunk
from router.observability.cache_stats import CacheStats
from router.observability.latency_window import LiveLatency
from router.observability.metrics import RouterMetrics
from router.observability.telemetry import Telemetry
from router.placement.kv_index import KVIndex
from router.placement.kv_wait import KVWaitQueue
from router.placement.live_worker import LiveWorker
from router.placement.pool_lookup import PoolLookup
from router.placement.worker_view import WorkerView

log = logging.getLogger(__name__)

NO_TOKENIZER = (
    "the router has no tokenizer: start it with --tokenizer-dir (env KVSERVE_TOKENIZER_DIR) "
    "naming the model directory on this machine (it never reads one from the worker registry)"
)


class RouterService:
    """One router's shared state (workers, pool lookup, planner, KV queue, metrics,
    tokenizer, controller); the lifecycle of the module docstring."""

    def __init__(self, router: RouterConfig, cluster: ClusterConfig, pool: PoolConfig) -> None:
        self.config = router
        self.cluster = cluster
        self.router_id = router.resolved_router_id()
        self.metrics = RouterMetrics(self.router_id)
        self.cache_stats = CacheStats()
        self.view = WorkerView(cluster, on_poll=self._on_poll, on_reject=self._on_reject)
        lease = ControllerLease(cluster, self.router_id, lease_ttl_s(router.controller_interval_s))
        self.controller = RoleController(router, self.view, self.metrics, lease)
        self.latency = LiveLatency()
        self.telemetry = Telemetry(
            self.metrics, self.cache_stats, self.controller.record, self.latency
        )
        self.pool_config = pool
        self.pool = PoolLookup(pool, cluster, router.pool_lookup, router.pool_lookup_timeout_s)
        self.kv_index = KVIndex(cluster, self.metrics.index.count_batch, self._on_reject_event)
        refused = self.metrics.admission_rejections
        self.planner = Planner(
            router, self.view.live, self.pool, lambda w: refused.labels(w).inc(), self.kv_index
        )
        self.kv_wait = KVWaitQueue(self.metrics.kv_waiting.set, self.metrics.kv_wait.observe)
        self._reports: dict[str, float] = {}
        """Worker id -> when its load report seen at the last poll was made."""
        self.started_at = int(time.time())
        self.tokenizers = TokenizerSlot()

    async def start(self) -> None:
        self.pool.start()
        await self.kv_index.start()
        await self.view.start()
        if self.config.tokenizer_dir:
            self.tokenizers.preload(Path(self.config.tokenizer_dir))
        else:
            log.error("%s", NO_TOKENIZER)
        if self.config.controller:
            self.controller.start()

    async def stop(self) -> None:
        await self.controller.stop()
        await self.view.stop()
        await self.kv_index.stop()
        await self.pool.close()

    def serving(self) -> list[LiveWorker]:
        """Live workers that can take a request end to end (decode or mixed, not draining)."""
        return [w for w in self.view.live() if w.serves_requests]

    def model_name(self) -> str | None:
        """The served model name: configured, else the workers' (None: nobody to ask)."""
        if self.config.served_model_name:
            return self.config.served_model_name
        live = self.view.live()
        return live[0].record.model if live else None

    def max_model_len(self) -> int | None:
        """The shortest context length the live workers report (None: none reports one)."""
        lengths = [w.record.max_model_len for w in self.view.live() if w.record.max_model_len > 0]
        return min(lengths) if lengths else None

    async def tokenizer(self) -> Tokenizer:
        """The router's tokenizer, loaded once; 503 without ``tokenizer_dir``."""
        return await self.tokenizers.get(self._tokenizer_dir)

    def _tokenizer_dir(self) -> Path:
        """``tokenizer_dir``; 503 without one. The workers' ``model_dir`` is never used: it
        is a path on their machines, and anyone who can write to Redis could name any
        directory of the router's machine in it."""
        if not self.config.tokenizer_dir:
            raise unavailable(NO_TOKENIZER)
        return Path(self.config.tokenizer_dir)

    async def run(self, admitted: AdmittedRequest) -> AsyncIterator[Chunk]:
        """Place ``admitted`` (503, 429: raised here, before any worker is called) and
        return its flow's chunks (iterate them once; errors then come from the flow)."""
        plan = await self.planner.plan(admitted)
        return RequestFlow(plan, self.telemetry, self.kv_wait, self.view.renewed).chunks()

    def render_metrics(self) -> bytes:
        """The Prometheus text of ``/metrics`` (SLO attainment as of now)."""
        self.controller.export()
        return self.metrics.render()

    def _on_poll(self, live: list[LiveWorker]) -> None:
        self.kv_index.sync(live)
        self.metrics.index.update_blocks(self.kv_index.index.stats())
        if live:  # the workers' model, never --served-model-name: see proto.metric_names
            self.metrics.set_model(live[0].record.model)
        self.metrics.update_roles(w.role for w in live)
        reports = {w.worker_id: w.record.heartbeat_at for w in live}
        if reports != self._reports:  # fresh load reports: pages may have come free
            self.kv_wait.wake()
        self._reports = reports

    def _on_reject(self, rejection: Rejection) -> None:
        self.metrics.registry_rejections.labels(rejection.reason).inc()

    def _on_reject_event(self, rejection: Rejection) -> None:
        log.warning("KV event refused: %s", rejection)  # each one: a forger is at work
        self.metrics.index.count_rejected(rejection)
