"""The router without HTTP: from validated fields to a placed :class:`RequestFlow`.

Lifecycle of :class:`RouterService`:

1. built by the app with the three configs; ``start()`` starts joining the pool as a
   lookup client (optional, in the background), starts the worker view (first registry
   poll included) and, with ``--controller``, the P:D ratio controller;
2. per request, before any worker is called: :meth:`check_model` (404/503),
   :meth:`tokenizer` (loaded once from ``tokenizer_dir``, the router's own setting: never
   from a path read from the registry; 503 without one), :meth:`check_length`
   (400), then :meth:`plan` (pool lookup, conductor placement; 503 when nobody can serve;
   429 with ``Retry-After`` when admission control predicts too late a first token);
3. :meth:`flow` runs the plan; its chunks report to the shared metrics and cache stats,
   and its result to the controller's SLO window. Flows share one queue for KV memory
   (:mod:`router.kv_wait`): a request whose decode reservation finds no free pages waits
   there, and a registry poll that brings fresh load reports wakes it to try again;
4. ``stop()`` ends the controller and the worker view and leaves the pool.

Every worker record used here (model name, ``max_model_len``, load, pool key space) has
passed the registry's MAC and schema checks (:mod:`router.workers`); the refused ones are
counted in ``kvserve_registry_rejected_records_total``.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

from kvpool.config import PoolConfig
from proto import worker_pb2 as pb
from proto.registry import ClusterConfig, Rejection
from router.admission import admit
from router.cache_stats import CacheStats
from router.conductor import PlacementRequest, make_policy
from router.config import RouterConfig
from router.controller import RoleController
from router.errors import APIError, invalid, too_busy, unavailable
from router.flow import FlowPlan, RequestFlow
from router.kv_wait import KVWaitQueue
from router.metrics import RouterMetrics
from router.pending import PendingLoad
from router.pool_lookup import PoolLookup
from router.telemetry import Telemetry
from router.tokenizer import PromptTokenizer, TokenizerSlot
from router.workers import LiveWorker, WorkerView

log = logging.getLogger(__name__)

NO_TOKENIZER = (
    "the router has no tokenizer: start it with --tokenizer-dir (env KVSERVE_TOKENIZER_DIR) "
    "naming the model directory on this machine (it never reads one from the worker registry)"
)


class RouterService:
    def __init__(self, router: RouterConfig, cluster: ClusterConfig, pool: PoolConfig) -> None:
        self.config = router
        self.cluster = cluster
        self.metrics = RouterMetrics()
        self.cache_stats = CacheStats()
        self.view = WorkerView(cluster, on_poll=self._on_poll, on_reject=self._on_reject)
        self.controller = RoleController(router, self.view, self.metrics)
        self.telemetry = Telemetry(self.metrics, self.cache_stats, self.controller.record)
        self.pool = PoolLookup(pool, cluster, router.pool_lookup, router.pool_lookup_timeout_s)
        self.policy = make_policy(router.policy, router.disagg_threshold_tokens)
        self.pending = PendingLoad()
        self.kv_wait = KVWaitQueue(self.metrics.kv_waiting.set, self.metrics.kv_wait.observe)
        self._reports: dict[str, float] = {}
        """Worker id -> when its load report seen at the last poll was made."""
        self.started_at = int(time.time())
        self.tokenizers = TokenizerSlot()

    async def start(self) -> None:
        self.pool.start()
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
        lengths = [w.record.max_model_len for w in self.view.live() if w.record.max_model_len > 0]
        return min(lengths) if lengths else None

    def check_model(self, requested: str) -> None:
        """404 for another model; 503 when no worker could serve a request now."""
        if not self.serving():
            raise unavailable(
                f"no decode-capable worker is registered in cluster {self.cluster.cluster!r}"
            )
        name = self.model_name()
        if requested != name:
            raise APIError(
                404,
                f"The model '{requested}' does not exist (this server serves '{name}')",
                "model",
                "model_not_found",
            )

    async def tokenizer(self) -> PromptTokenizer:
        return await self.tokenizers.get(self._tokenizer_dir)

    def _tokenizer_dir(self) -> Path:
        """``tokenizer_dir``; 503 without one. The workers' ``model_dir`` is never used: it
        is a path on their machines, and anyone who can write to Redis could name any
        directory of the router's machine in it."""
        if not self.config.tokenizer_dir:
            raise unavailable(NO_TOKENIZER)
        return Path(self.config.tokenizer_dir)

    def check_length(self, prompt_tokens: int, max_tokens: int | None, param: str) -> int:
        """The output limit to use (``max_tokens``, or what the context leaves); 400 when
        the prompt is empty or prompt + output exceeds the model's context length."""
        if prompt_tokens == 0:
            raise invalid("the prompt is empty", param, "invalid_value")
        limit = self.max_model_len()
        if limit is None:
            if max_tokens is None:
                raise invalid("max_tokens is required: the model length is unknown", "max_tokens")
            return max_tokens
        wanted = max_tokens if max_tokens is not None else max(1, limit - prompt_tokens)
        if prompt_tokens + wanted > limit:
            raise invalid(
                f"This model's maximum context length is {limit} tokens. However, you "
                f"requested {prompt_tokens + wanted} tokens ({prompt_tokens} in the "
                f"{param}, {wanted} in the completion). Please reduce the length of the "
                f"{param} or completion.",
                param,
                "context_length_exceeded",
            )
        return wanted

    async def plan(
        self,
        prompt_token_ids: Sequence[int],
        params: pb.SamplingParams,
        started_at: float,
        cache_salt: str = "",
    ) -> FlowPlan:
        """Look the prompt up in the pool (under ``cache_salt``, the request's tenant salt)
        and place it; 503 when nobody can serve it, 429 when admission control refuses it
        (:mod:`router.admission`; then nothing is counted as pending)."""
        live = self.view.live()
        pooled = (
            await self.pool.pooled_tokens(prompt_token_ids, live[0].record, cache_salt)
            if live
            else 0
        )
        request = PlacementRequest(prompt_tokens=len(prompt_token_ids), pooled_tokens=pooled)
        loads = self.pending.apply([w.load() for w in live])
        placement = self.policy.place(request, loads)
        if placement is None:
            raise unavailable("no decode-capable worker can take a request now")
        rejection = admit(placement, request, loads, self.config.admission_ttft_s)
        if rejection is not None:
            self.metrics.admission_rejections.labels(rejection.worker).inc()
            raise too_busy(rejection.message, rejection.retry_after_s)
        self.pending.placed(placement, request, loads)
        by_id = {w.worker_id: w for w in live}
        return FlowPlan(
            request_id=uuid.uuid4().hex,
            prompt_token_ids=list(prompt_token_ids),
            params=params,
            prefill=by_id[placement.prefill] if placement.prefill else None,
            decode=tuple(by_id[d] for d in placement.decode),
            lease_ms=self.config.reserve_lease_ms,
            timeout_s=self.config.request_timeout_s,
            started_at=started_at,
            cache_salt=cache_salt,
        )

    def flow(self, plan: FlowPlan) -> RequestFlow:
        return RequestFlow(plan, self.telemetry, self.kv_wait, self.view.renewed)

    def render_metrics(self) -> bytes:
        """The Prometheus text of ``/metrics`` (SLO attainment as of now)."""
        self.controller.export()
        return self.metrics.render()

    def _on_poll(self, live: list[LiveWorker]) -> None:
        self.metrics.update_workers((w.worker_id, w.record.load) for w in live)
        self.metrics.update_roles(w.role for w in live)
        reports = {w.worker_id: w.record.heartbeat_at for w in live}
        if reports != self._reports:  # fresh load reports: pages may have come free
            self.kv_wait.wake()
        self._reports = reports

    def _on_reject(self, rejection: Rejection) -> None:
        self.metrics.registry_rejections.labels(rejection.reason).inc()
