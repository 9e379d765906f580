"""One request's decode candidates, best first, and what became of each.

Lifecycle of :class:`Candidates`: built from a plan's decode candidates -> while reserving,
:meth:`reservable` and :meth:`leave_out` (a candidate whose call failed is out for good);
while generating, :meth:`next_untried` (those not tried yet, then those worth asking once
more) -> at any failed call, :meth:`renewed` first: a candidate that failed UNAVAILABLE may
have been restarted, and the router's view not have caught up yet (its channel still backs
off from the dead process); the view is refreshed at once, and a new process serving the
same worker id takes the candidate's place. Each worker id is renewed at most once per
request, so a request never loops on a dead worker.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Sequence

import grpc

from router.placement.live_worker import LiveWorker

Renew = Callable[[LiveWorker], Awaitable[LiveWorker | None]]
"""A worker's successor, if a new process serves its id now (``WorkerView.renewed``)."""


class Candidates:
    def __init__(self, workers: Sequence[LiveWorker], renew: Renew | None = None) -> None:
        self._workers = list(workers)
        self._renew = renew
        self._renewed: set[str] = set()
        self.left_out: dict[str, grpc.aio.AioRpcError] = {}
        """Candidates out of the running for a reservation, with their error."""

    @property
    def first(self) -> LiveWorker | None:
        return self._workers[0] if self._workers else None

    def reservable(self) -> list[LiveWorker]:
        """The candidates not left out, best first."""
        return [w for w in self._workers if w.worker_id not in self.left_out]

    def leave_out(self, worker: LiveWorker, error: grpc.aio.AioRpcError) -> None:
        self.left_out[worker.worker_id] = error

    def next_untried(
        self, tried: Collection[str], again: Collection[str] = ()
    ) -> LiveWorker | None:
        """The best candidate whose id is not in ``tried``; with none left, the best whose id
        is in ``again`` (tried, and worth asking once more)."""
        fresh = (w for w in self._workers if w.worker_id not in tried)
        return next(fresh, None) or next((w for w in self._workers if w.worker_id in again), None)

    async def renewed(self, worker: LiveWorker, error: grpc.aio.AioRpcError) -> LiveWorker | None:
        """``worker``'s successor when its call failed UNAVAILABLE and a new process serves
        its id now (it then replaces ``worker`` among the candidates); else None."""
        if (
            self._renew is None
            or error.code() != grpc.StatusCode.UNAVAILABLE
            or worker.worker_id in self._renewed
        ):
            return None
        self._renewed.add(worker.worker_id)
        fresh = await self._renew(worker)
        if fresh is not None:
            self._workers = [fresh if w.worker_id == fresh.worker_id else w for w in self._workers]
        return fresh
