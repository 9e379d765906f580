"""The workers one request touched, and aborting it on them.

A flow enters a worker before each call that may leave something behind on it (a
reservation, a prefill, a generation: a failed call may still hold pages) and drops it once
it holds nothing (a "not now" reservation) or was left (:meth:`Involved.leave`). Whatever
ends the flow early, :meth:`Involved.abort_all` sends ``Abort(request_id)`` to every worker
still entered, shielded from the cancellation, each call bounded by
:data:`ABORT_TIMEOUT_S`; a failed abort is logged (the worker's lease frees the pages).
"""

from __future__ import annotations

import asyncio
import logging

import anyio

from proto import worker_pb2 as pb
from router.placement.live_worker import LiveWorker

log = logging.getLogger(__name__)

ABORT_TIMEOUT_S = 2.0


class Involved:
    """The workers request ``request_id`` touched, by worker id."""

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self._workers: dict[str, LiveWorker] = {}

    def add(self, worker: LiveWorker) -> None:
        """``worker`` may hold something of the request from now on."""
        self._workers[worker.worker_id] = worker

    def discard(self, worker: LiveWorker) -> None:
        """``worker`` holds nothing of the request (no abort needed)."""
        self._workers.pop(worker.worker_id, None)

    async def abort_all(self) -> None:
        """:meth:`abort` on every worker entered."""
        await self.abort(list(self._workers.values()))

    async def leave(self, workers: list[LiveWorker]) -> None:
        """Abort on ``workers`` (whatever they may have started) and forget them."""
        await self.abort(workers)
        for worker in workers:
            self.discard(worker)

    async def abort(self, workers: list[LiveWorker]) -> None:
        """``Abort`` on ``workers``, concurrently; shielded so a cancelled request still
        frees its pages; failures are logged (the worker's lease frees them anyway)."""
        request = pb.AbortRequest(request_id=self.request_id)
        with anyio.CancelScope(shield=True):
            results = await asyncio.gather(
                *(w.stub.Abort(request, timeout=ABORT_TIMEOUT_S) for w in workers),
                return_exceptions=True,
            )
        for worker, result in zip(workers, results, strict=True):
            if isinstance(result, BaseException):
                log.warning("abort of %s on %s failed: %s", self.request_id,
                            worker.worker_id, result)  # fmt: skip
