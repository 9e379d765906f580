"""Admission control: refuse (HTTP 429) a request whose first token would come too late. Pure.

Called by :meth:`router.flow.plan.Planner.plan` right after placement and before the
placement is counted as pending work, with the loads the placement was made on (the
workers' reports plus this router's pending placements, :mod:`router.placement.pending`):

1. the worker that prefills is the placement's prefill worker, or its first decode
   candidate when that one prefills locally;
2. its predicted TTFT is its queued prefill tokens plus this request's uncached tokens,
   divided by its measured prefill speed (``prefill_tokens_per_s``); a worker that has not
   measured its speed yet (0) gives no prediction, and nothing is refused on a guess;
3. past ``limit_s`` the request is refused; the client may retry after the predicted
   excess (the time the queue needs to drain that far), in whole seconds, at least 1.

Refusing early is kinder than queueing: a request that waits longer than the limit would
miss any interactive SLO and likely its client's or proxy's timeout, after having taken
its place in the queue from requests that could still make it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from router.placement.policies import Placement, PlacementRequest, WorkerLoad


@dataclass(frozen=True)
class Rejection:
    """Why a request is refused: ``worker`` would prefill it ``predicted_s`` from now."""

    worker: str
    predicted_s: float
    limit_s: float

    @property
    def retry_after_s(self) -> int:
        """Whole seconds until the queue should have drained enough (at least 1)."""
        return max(1, math.ceil(self.predicted_s - self.limit_s))

    @property
    def message(self) -> str:
        return (
            f"The server is overloaded: this request's first token is predicted in "
            f"{self.predicted_s:.1f} s, over the {self.limit_s:g} s limit. Retry after "
            f"{self.retry_after_s} s."
        )


def prefilling_worker(placement: Placement) -> str:
    """The worker that computes the request's prompt (step 1)."""
    return placement.prefill or placement.decode[0]


def predicted_ttft_s(worker: WorkerLoad, request: PlacementRequest) -> float | None:
    """Step 2: seconds until ``worker`` has prefilled ``request``, computing only what
    neither the pool nor its local cache holds (None: speed unknown)."""
    speed = worker.prefill_tokens_per_s
    if not speed > 0 or not math.isfinite(speed):
        return None
    return (worker.queued_prefill_tokens + request.uncached_on(worker.worker_id)) / speed


def admit(
    placement: Placement,
    request: PlacementRequest,
    loads: Sequence[WorkerLoad],
    limit_s: float,
) -> Rejection | None:
    """None to admit ``request`` as placed on ``loads``, else why not; ``limit_s`` <= 0
    turns admission control off."""
    if limit_s <= 0:
        return None
    worker_id = prefilling_worker(placement)
    load = next((w for w in loads if w.worker_id == worker_id), None)
    predicted = predicted_ttft_s(load, request) if load is not None else None
    if predicted is None or predicted <= limit_s:
        return None
    return Rejection(worker_id, predicted, limit_s)
