"""Work placed since the last load report: the router's own placements, counted at once. Pure.

Load reports arrive every heartbeat (and the router polls them), so a worker's report can be
a second or more old. Ranking by it alone sends a whole burst to whichever worker looked
best when the burst began (herding: seen in ``kvserve sim`` as half the SLO attainment of
round-robin on a burst of long prompts). :class:`PendingLoad` remembers what this router
placed on each worker since that worker's current report and adds it to the report:

1. :meth:`PendingLoad.apply` returns the reports with the pending work added (a worker whose
   report is newer than the pending work, i.e. one that already counts it, loses its extras);
2. :meth:`PendingLoad.placed` records a placement against the reports it was made on: the
   uncached prompt tokens join the queue of the worker that prefills (the prefill worker, or
   the first decode candidate when it prefills locally), and the request joins the waiting
   requests of the first decode candidate.

Only this router's placements are counted (routers do not share them): with several routers,
each still sees the others' work one report late.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from router.placement.policies import Placement, PlacementRequest, WorkerLoad


@dataclass
class _Extra:
    report_at: float
    queued_prefill_tokens: int = 0
    waiting: int = 0


class PendingLoad:
    def __init__(self) -> None:
        self._extra: dict[str, _Extra] = {}

    def apply(self, loads: Sequence[WorkerLoad]) -> list[WorkerLoad]:
        """``loads`` plus the work placed on each since its report (module docstring)."""
        out = []
        for w in loads:
            extra = self._extra.get(w.worker_id)
            if extra is not None and extra.report_at != w.report_at:
                del self._extra[w.worker_id]  # a newer report already counts it
                extra = None
            if extra is None:
                out.append(w)
                continue
            queued = w.queued_prefill_tokens + extra.queued_prefill_tokens
            out.append(replace(w, queued_prefill_tokens=queued, waiting=w.waiting + extra.waiting))
        return out

    def placed(
        self, placement: Placement, request: PlacementRequest, loads: Sequence[WorkerLoad]
    ) -> None:
        """Count ``placement`` (made on ``loads``) until the workers' next reports."""
        stamps = {w.worker_id: w.report_at for w in loads}
        prefiller = placement.prefill or placement.decode[0]
        self._add(prefiller, stamps, tokens=request.uncached_on(prefiller))
        self._add(placement.decode[0], stamps, requests=1)

    def _add(
        self, worker_id: str, stamps: dict[str, float], tokens: int = 0, requests: int = 0
    ) -> None:
        at = stamps.get(worker_id, 0.0)
        extra = self._extra.get(worker_id)
        if extra is None or extra.report_at != at:
            extra = self._extra[worker_id] = _Extra(at)
        extra.queued_prefill_tokens += tokens
        extra.waiting += requests
