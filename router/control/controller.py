"""The P:D ratio controller's I/O side: it runs :class:`router.control.ratio.RatioController`
against the live cluster and moves workers with ``SetRole``.

Lifecycle of :class:`RoleController`:

1. built by the router service; every finished request reaches :meth:`record` (through
   the flow telemetry) whether or not the controller runs, so ``GET /v1/controller``
   always shows the SLO window; a cancelled request (the client left) is not a sample, a
   failed one is a TTFT miss;
2. ``start()`` (only with ``--controller``) starts a task that, at once and then every
   ``controller_interval_s``, takes or renews the controller's lease in Redis
   (:mod:`router.control.lease`, in a thread) and calls :meth:`tick` only while this
   router holds it: of several routers, one decides at a time. A router that has just
   taken the lease (a new term) first waits one cool-down
   (:meth:`router.control.ratio.RatioController.hold_off`): the previous holder may have just
   moved a worker. One that fails to renew it (taken over, expired, Redis unreachable:
   logged, never raised) stops deciding at once; its moves in flight go on to their end.
   ``kvserve:controller_leader`` is 1 while held here;
3. :meth:`tick` asks the policy, with the live workers' loads; a decided change is
   logged, the worker is held as draining in the router's view at once (no new request is
   placed on it; :meth:`router.placement.worker_view.WorkerView.hold`) and a move task starts;
4. the move task calls the worker's ``SetRole``, which drains (refusing new work with
   UNAVAILABLE, which flows take elsewhere: see :mod:`router.flow.run`) and waits for its
   in-flight requests and reservations, hence the deadline of a whole request plus a lease;
   the reply completes the change (cool-down; the hold lasts until the registry shows the
   new role) and any error fails it (the hold ends at once); either is logged and counted
   in ``kvserve:role_changes_total``;
5. ``stop()`` cancels the loop and any move in flight (the worker's cancelled ``SetRole``
   leaves its role as it was), then releases the lease (another router's controller
   takes over at its next interval, not a TTL later).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import grpc

from proto import worker_pb2 as pb
from router.config import RouterConfig
from router.control.lease import ControllerLease
from router.control.ratio import RatioController, RoleChange
from router.flow.types import FlowResult
from router.observability.metrics import RouterMetrics
from router.placement.live_worker import LiveWorker
from router.placement.worker_view import WorkerView

log = logging.getLogger(__name__)

SET_ROLE_MARGIN_S = 60.0
"""Added to the longest drain (a whole request plus a reservation lease)."""


class RoleController:
    """The lifecycle of the module docstring; ``lease``: this router's handle on the
    controller's lease (:class:`router.control.lease.ControllerLease`)."""

    def __init__(
        self,
        config: RouterConfig,
        view: WorkerView,
        metrics: RouterMetrics,
        lease: ControllerLease,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.lease = lease
        self.policy = RatioController(config.ratio)
        self.view = view
        self.metrics = metrics
        self.clock = clock
        self.set_role_timeout_s = (
            config.request_timeout_s + config.reserve_lease_s + SET_ROLE_MARGIN_S
        )
        self._history: list[dict[str, Any]] = []
        self._loop: asyncio.Task[None] | None = None
        self._moves: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        log.info("P:D controller on: every %.1f s, %s", self.config.controller_interval_s,
                 self.config.ratio)  # fmt: skip
        self._loop = asyncio.create_task(self._run(), name="pd-controller")

    async def stop(self) -> None:
        started = self._loop is not None
        tasks = [*self._moves, *([self._loop] if self._loop else [])]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._loop = None
        if started:  # even when not known held: a renewal's lost reply may have kept it
            if await asyncio.to_thread(self.lease.release):
                log.info("P:D controller: lease released by %s", self.lease.holder_id)
            self.metrics.controller_leader.set(0)
        await asyncio.to_thread(self.lease.close)

    def record(self, result: FlowResult) -> None:
        """One finished flow into the SLO window (see step 1)."""
        if result.status == "cancelled":
            return
        ok = result.status == "ok"
        ttft = result.ttft_s if ok else None
        self.policy.record(self.clock(), ttft, result.tpot_s if ok else None)

    def export(self) -> None:
        """Set the SLO attainment gauges from the window as of now."""
        ttft, tpot, _ = self.policy.window.attainment(self.clock())
        self.metrics.update_attainment(ttft, tpot)

    def report(self) -> dict[str, Any]:
        """The body of ``GET /v1/controller`` (times on :attr:`clock`, as ``now_s``)."""
        now = self.clock()
        return {
            "enabled": self.config.controller,
            "interval_s": self.config.controller_interval_s,
            "now_s": now,
            "config": asdict(self.config.ratio),
            "snapshot": self.policy.snapshot(now),
            "history": [dict(entry) for entry in self._history],
            "lease": {"holder": self.lease.holder, "held_here": self.lease.held},
        }

    async def observe_lease(self) -> None:
        """Read the lease's holder now (for :meth:`report`; a Redis failure reads as no
        holder), on any router, whether its controller runs or not."""
        await asyncio.to_thread(self.lease.look)

    async def _run(self) -> None:
        while True:  # the lease at once (a restarted router knows its holder), then ticks
            try:
                if await self.lead():
                    self.tick()
            except Exception:  # keep controlling whatever one evaluation hit
                log.exception("P:D controller evaluation failed")
            await asyncio.sleep(self.config.controller_interval_s)

    async def lead(self) -> bool:
        """Take or renew the lease (step 2); whether this router decides now. A new term
        starts with a cool-down; a change of state is logged."""
        was, term = self.lease.held, self.lease.term
        held = await asyncio.to_thread(self.lease.take)
        self.metrics.controller_leader.set(int(held))
        if held and self.lease.term != term:
            self.policy.hold_off(self.clock())
            log.info("P:D controller: %s holds the lease; first decision after the cool-down "
                     "(%.0f s)", self.lease.holder_id, self.config.ratio.cooldown_s)  # fmt: skip
        elif was and not held:
            log.warning("P:D controller: %s lost the lease (holder now %s): not deciding",
                        self.lease.holder_id, self.lease.holder)  # fmt: skip
        return held

    def tick(self) -> RoleChange | None:
        """One evaluation (step 3); returns the change it started, if any."""
        live = self.view.live()
        self.export()
        change = self.policy.decide(self.clock(), [w.load() for w in live])
        if change is None:
            return None
        worker = next(w for w in live if w.worker_id == change.worker_id)
        log.info("P:D controller: moving %s from %s to %s: %s", change.worker_id,
                 change.from_role, change.to_role, change.reason)  # fmt: skip
        entry: dict[str, Any] = {**change.as_dict(), "result": None, "completed_at": None}
        self._history.append(entry)
        self.view.hold(change.worker_id, change.to_role)
        task = asyncio.create_task(self._move(worker, change, entry), name="pd-move")
        self._moves.add(task)
        task.add_done_callback(self._moves.discard)
        return change

    async def _move(self, worker: LiveWorker, change: RoleChange, entry: dict[str, Any]) -> None:
        request = pb.SetRoleRequest(role=change.to_role)
        try:
            reply = await worker.stub.SetRole(request, timeout=self.set_role_timeout_s)
            error = None if reply.role == change.to_role else f"the worker is {reply.role}"
        except grpc.aio.AioRpcError as exc:
            error = f"{exc.code().name}: {exc.details()}"
        now = self.clock()
        entry["completed_at"] = now
        if error is None:
            self.policy.completed(change, now)
            entry["result"] = "completed"
            log.info("P:D controller: %s is now %s (%.1f s)", change.worker_id, change.to_role,
                     now - change.at_s)  # fmt: skip
        else:
            self.view.release(change.worker_id)
            self.policy.failed(change, now)
            entry["result"], entry["error"] = "failed", error
            log.warning("P:D controller: moving %s to %s failed: %s", change.worker_id,
                        change.to_role, error)  # fmt: skip
        self.metrics.role_changes.labels(change.from_role, change.to_role, entry["result"]).inc()
