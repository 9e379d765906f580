"""The prefix index's metrics: KV event batches by outcome, refused stream
entries, blocks indexed per worker, and the index's predicted local hits against the
workers' actual ones, so index drift is visible on ``/metrics``."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from proto.metric_names import OURS
from proto.refusals import Rejection
from router.placement.prefix_index import IndexStats, Outcome

PREDICTION_OUTCOMES = ("exact", "over", "under")
"""``exact``: the worker hit locally what the index said; ``over``: fewer tokens (the
index was stale: blocks evicted, or not yet stored); ``under``: more (events not yet
read)."""


class IndexMetrics:
    """Registered on the router's registry with
    :class:`router.observability.metrics.RouterMetrics`."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.batches = Counter(
            f"{OURS}kv_event_batches", "KV event batches read, by what the index did with "
            "them (applied, snapshot, stale, gap, ignored)", ("outcome",), registry=r,
        )  # fmt: skip
        self.rejected = Counter(
            f"{OURS}kv_event_rejected", "KV event stream entries refused, by reason (mac: "
            "not written with the cluster secret; invalid; size)", ("reason",), registry=r,
        )  # fmt: skip
        self.blocks = Gauge(
            f"{OURS}prefix_index_blocks", "Blocks the router's index says each worker holds "
            "locally (0 while it waits for the worker's snapshot)", ("worker",), registry=r,
        )  # fmt: skip
        self.predicted = Counter(
            f"{OURS}local_hit_predicted_tokens", "Prompt tokens the router's index predicted "
            "the prefilling worker to hold locally (prefills it had a prediction for)",
            ("worker",), registry=r,
        )  # fmt: skip
        self.actual = Counter(
            f"{OURS}local_hit_actual_tokens", "Prompt tokens the prefilling worker actually "
            "took from its local cache, for the same prefills", ("worker",), registry=r,
        )  # fmt: skip
        self.predictions = Counter(
            f"{OURS}local_hit_predictions", "Prefills by how the predicted local hit compared "
            "with the actual one (exact, over, under)", ("worker", "outcome"), registry=r,
        )  # fmt: skip
        self._workers: set[str] = set()

    def count_batch(self, outcome: Outcome) -> None:
        self.batches.labels(outcome.value).inc()

    def count_rejected(self, rejection: Rejection) -> None:
        self.rejected.labels(rejection.reason).inc()

    def update_blocks(self, stats: IndexStats) -> None:
        """Set the per-worker gauge from the index's stats; drop workers it forgot."""
        for worker, blocks in stats.blocks.items():
            self.blocks.labels(worker).set(blocks)
        for gone in self._workers - set(stats.blocks):
            self.blocks.remove(gone)
        self._workers = set(stats.blocks)

    def observe_prediction(self, worker: str, predicted: int, actual: int) -> None:
        self.predicted.labels(worker).inc(predicted)
        self.actual.labels(worker).inc(actual)
        self.predictions.labels(worker, prediction_outcome(predicted, actual)).inc()


def prediction_outcome(predicted: int, actual: int) -> str:
    """One of :data:`PREDICTION_OUTCOMES`."""
    return "exact" if predicted == actual else "over" if predicted > actual else "under"
