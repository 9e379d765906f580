"""A flow's turn in the router's KV queue, and the decode reservation it waits for.

:meth:`Reserver.reserve_once` in :meth:`Reserver.take_turn` (disaggregated flows):
``Reserve`` on the first decode candidate that accepts (pages held under the plan's lease).
While every candidate answers "no free pages now", the request waits its turn in the
router's queue for KV memory (:mod:`router.placement.kv_wait`), holding nothing, until its deadline
(504). A candidate whose call fails (unreachable, draining) or that can never fit the
request (INVALID_ARGUMENT) is left out (one that failed UNAVAILABLE is first looked up
again: a restarted worker is asked at once, :mod:`router.placement.candidates`); none left is a 400
when none could ever fit it (the worker's reason), else a 503.

:meth:`Reserver.take_turn` (every flow): any attempt in that queue, e.g. a local request's,
which needs no reservation but waits behind the requests queued before it.

Every worker asked is entered in the flow's :class:`~router.flow.involved.Involved` before the
call (a failed call may still hold pages) and dropped when it answered "not now" (it holds
nothing), so that the flow aborts exactly the workers that may hold something.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import grpc

from proto import worker_pb2 as pb
from router.errors import APIError, unavailable
from router.flow.involved import Involved
from router.flow.plan import FlowPlan
from router.flow.types import rpc_error
from router.placement.candidates import Candidates
from router.placement.kv_wait import KVWaitQueue
from router.placement.live_worker import LiveWorker

T = TypeVar("T")


class Reserver:
    """One flow's reservation step: ``plan`` fixes what is reserved and the deadline;
    ``candidates`` and ``involved`` are the flow's own (shared, updated in place)."""

    def __init__(
        self,
        plan: FlowPlan,
        candidates: Candidates,
        involved: Involved,
        kv_wait: KVWaitQueue,
    ) -> None:
        self.plan = plan
        self._candidates = candidates
        self._involved = involved
        self._kv_wait = kv_wait
        self.push_target: pb.PushTarget | None = None
        """Where the holder of the reservation takes a direct push, if it offered one (the
        plan asked: ``FlowPlan.push``); passed on to the prefill worker as it is."""

    async def take_turn(self, attempt: Callable[[], Awaitable[T | None]]) -> T:
        """``attempt`` in the router's KV queue (:meth:`KVWaitQueue.admit`); 504 when the
        deadline passes while waiting. With :meth:`reserve_once` as the attempt, it is
        tried again whenever woken while it answers "not now"."""
        try:
            return await self._kv_wait.admit(attempt, self.plan.seconds_left)
        except TimeoutError:
            raise APIError(
                504,
                "the request timed out waiting for free KV cache on the decode workers",
                None,
                "timeout",
            ) from None

    async def reserve_once(self) -> LiveWorker | None:
        """``Reserve`` on each decode candidate still in the running, best first: the first
        that holds pages; None when the others answered "no free pages now"; raises
        :meth:`_no_reservation` when none is left. A candidate whose call failed
        (unreachable, draining, or the request can never fit there) is out for good, unless
        it failed UNAVAILABLE and a restarted process serves it now (its successor is asked
        at once: :mod:`router.placement.candidates`)."""
        request = pb.ReserveRequest(
            request_id=self.plan.request_id,
            prompt_token_ids=self.plan.prompt_token_ids,
            max_tokens=self.plan.params.max_tokens,
            lease_ms=self.plan.lease_ms,
            cache_salt=self.plan.cache_salt,
            offer_push=self.plan.push,
        )
        for candidate in self._candidates.reservable():
            holder = await self._reserve_on(candidate, request)
            if holder is not None:
                return holder
        if self._candidates.reservable():
            return None
        raise self._no_reservation()

    async def _reserve_on(
        self, worker: LiveWorker, request: pb.ReserveRequest
    ) -> LiveWorker | None:
        """``Reserve`` on ``worker`` (on its successor when it was restarted): the worker
        that holds pages, or None ("not now", or the call failed: it is then left out)."""
        self._involved.add(worker)  # a failed call may still hold pages
        try:
            reply = await worker.stub.Reserve(request, timeout=self.plan.time_left())
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise
            fresh = await self._candidates.renewed(worker, exc)
            if fresh is not None:
                return await self._reserve_on(fresh, request)
            self._candidates.leave_out(worker, exc)
            return None
        if reply.ok:
            self.push_target = reply.push_target if reply.HasField("push_target") else None
            return worker
        self._involved.discard(worker)  # not now: it holds nothing
        return None

    def _no_reservation(self) -> APIError:
        """No candidate left: the workers' 400 when none could ever fit the request, else a
        503 naming each one's error."""
        left_out = self._candidates.left_out
        errors = list(left_out.values())
        if errors and all(e.code() == grpc.StatusCode.INVALID_ARGUMENT for e in errors):
            return rpc_error(errors[0])
        reasons = "; ".join(f"{w}: {e.code().name}" for w, e in left_out.items())
        return unavailable(
            f"no decode worker could reserve KV cache for this request ({reasons}); retry later"
        )
