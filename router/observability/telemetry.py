"""The :class:`router.flow.types.FlowObserver` of the app: flows report to metrics, cache
stats, the live latency windows of the status page (when given) and, through
``on_result``, to the P:D controller's SLO window."""

from __future__ import annotations

from collections.abc import Callable

from proto import worker_pb2 as pb
from router.flow.types import FlowResult
from router.observability.cache_stats import CacheStats, PrefillRecord
from router.observability.latency_window import LiveLatency
from router.observability.metrics import RouterMetrics
from router.observability.request_metrics import itl_of


class Telemetry:
    def __init__(
        self,
        metrics: RouterMetrics,
        cache_stats: CacheStats,
        on_result: Callable[[FlowResult], None] | None = None,
        latency: LiveLatency | None = None,
    ) -> None:
        self.metrics = metrics
        self.cache_stats = cache_stats
        self.latency = latency
        """Takes every TTFT and ITL sample that the histograms take (None: not kept)."""
        self.on_result = on_result
        """Called with every finished flow's result (after the metrics)."""

    def on_prefill(self, worker_id: str, usage: pb.PromptUsage, predicted: int | None) -> None:
        self.metrics.requests.observe_prefill(worker_id, usage)
        if predicted is not None:
            self.metrics.index.observe_prediction(worker_id, predicted, usage.local_tokens)
        parts = usage.local_tokens + usage.pool_tokens + usage.computed_tokens
        prompt = usage.prompt_tokens or parts
        self.cache_stats.record(
            PrefillRecord(
                worker_id=worker_id,
                prompt_tokens=prompt,
                local_tokens=usage.local_tokens,
                pool_tokens=usage.pool_tokens,
                computed_tokens=usage.computed_tokens,
                predicted_local_tokens=predicted,
            )
        )

    def on_transfer(self, direction: str, transfer: pb.Transfer) -> None:
        self.metrics.observe_transfer(direction, transfer.bytes, transfer.seconds)

    def on_first_token(self, mode: str, worker_id: str, seconds: float) -> None:
        self.metrics.requests.observe_first_token(mode, worker_id, seconds)
        if self.latency is not None:
            self.latency.ttft.add(seconds)

    def on_chunk(self, mode: str, worker_id: str, gap_s: float, tokens: int) -> None:
        self.metrics.requests.observe_chunk(mode, worker_id, gap_s, tokens)
        if self.latency is not None:
            self.latency.itl.add(itl_of(gap_s, tokens))

    def on_migrate(self, from_worker: str, to_worker: str) -> None:
        self.metrics.migrations.labels(from_worker, to_worker).inc()

    def on_handoff(self, path: str) -> None:
        self.metrics.handoffs.labels(path).inc()

    def on_finish(self, result: FlowResult) -> None:
        self.metrics.count_request(result.status)
        self.metrics.requests.observe_finish(result)
        if self.on_result is not None:
            self.on_result(result)
