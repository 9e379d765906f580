"""One request's life across the workers, as an async generator of :class:`Chunk`.

Disaggregated (the plan names a prefill worker):

1. ``Reserve`` on the first decode candidate that accepts, waiting in the router's queue
   for KV memory while none has free pages (:mod:`router.flow.reservation`: the turn, the
   retries, which candidate is left out, the 400/503/504 when none can hold it);
2. ``Prefill`` on the prefill worker; its first token (the stream's first message) is
   yielded at once (the TTFT);
3. if the first token already finished the request, ``Abort`` frees the reservation on the
   decode worker and the flow ends; else
4. ``Generate`` with ``first_token`` on the decode worker; its chunks are yielded.

Direct push (``FlowPlan.push``, :attr:`router.config.RouterConfig.kv_handoff`): the
``Reserve`` asks for a push target; when the decode worker offers one, the ``Prefill``
carries it, and a prefill whose push succeeded answers the pushed blocks' metas in a second
message, after its first token (the push's last layers stay off the first token's path),
which the first ``Generate`` (to that decode worker only) carries on. A push that failed answers no
metas: that ``Generate`` goes without, and the decode worker reads the pool, where the
prefill worker left the KV (the fallback). The router never reads the metas: it holds no
pool block key; the decode worker checks them.

Local (no prefill worker: conditional disaggregation, or a mixed worker):
``Generate`` without ``first_token`` on the first candidate, which prefills by itself and
queues the request for pages in its own scheduler. It needs no reservation, yet when others
wait in the router's KV queue it waits its turn behind them (first come, first served).

No request is lost to a role change (the P:D controller's, or anyone's): a worker that
does not take a call (:data:`router.flow.types.TRY_ELSEWHERE`: draining, a role changed, or
unreachable) before any output came is aborted and left. A refused ``Reserve`` moves on to
the next decode candidate; a refused ``Prefill`` frees the reservation and the decode side
prefills by itself (local mode); a refused ``Generate`` moves on to the next decode
candidate, carrying ``first_token`` (the prompt's KV is in the pool) if it had one, and a
candidate that refused it is asked once more after every other one.

Whatever ends the flow early (the consumer cancels or stops iterating, i.e. the client
went away; the deadline passes; an RPC fails; a worker aborts), ``Abort(request_id)`` goes
to every worker the request touched (:mod:`router.flow.involved`, shielded from the
cancellation) before the flow re-raises. RPC failures become
:class:`router.errors.APIError` with a status to show. The last chunk carries
``finish_reason`` and :class:`Usage`; the observer gets a :class:`FlowResult` when the flow
ends, however it ends (what the flow saw and the ``Generate`` stream itself:
:mod:`router.flow.stream`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from typing import TYPE_CHECKING

import grpc

from proto import worker_pb2 as pb
from router.errors import unavailable
from router.flow.involved import Involved
from router.flow.plan import FlowPlan
from router.flow.reservation import Reserver
from router.flow.stream import FlowTally, generate_chunks
from router.flow.types import (
    TRY_ELSEWHERE,
    Chunk,
    FlowObserver,
    checked_logprobs,
    rpc_error,
    status_of,
)
from router.placement.candidates import Candidates, Renew
from router.placement.kv_wait import KVWaitQueue
from router.placement.live_worker import LiveWorker

if TYPE_CHECKING:
    PrefillCall = grpc.aio.UnaryStreamCall[pb.PrefillRequest, pb.PrefillReply]

log = logging.getLogger(__name__)


class RequestFlow:
    """Lifecycle: built from a plan -> :meth:`chunks` iterated once -> done.

    ``kv_wait``: the router's queue for KV memory, shared by its flows (default: one of its
    own, i.e. nobody to wait behind); a flow wakes it when it ends (its pages came back).
    ``renew``: a restarted decode worker's new channel (:mod:`router.placement.candidates`)."""

    def __init__(
        self,
        plan: FlowPlan,
        observer: FlowObserver,
        kv_wait: KVWaitQueue | None = None,
        renew: Renew | None = None,
    ) -> None:
        self.plan = plan
        self.observer = observer
        self._kv_wait = kv_wait if kv_wait is not None else KVWaitQueue()
        self._involved = Involved(plan.request_id)
        self._candidates = Candidates(plan.decode, renew)
        self._decoder: LiveWorker | None = self._candidates.first
        self._reserver = Reserver(plan, self._candidates, self._involved, self._kv_wait)
        self._tally = FlowTally(plan, observer)

    async def chunks(self) -> AsyncIterator[Chunk]:
        plan = self.plan
        status = "error"
        try:
            body = self._local() if plan.prefill is None else self._disaggregated(plan.prefill)
            async with contextlib.aclosing(body):
                async for chunk in body:
                    yield chunk
            status = "ok"
        except grpc.aio.AioRpcError as exc:
            status = "timeout" if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED else "error"
            await self._involved.abort_all()
            raise rpc_error(exc) from None
        except BaseException as exc:  # cancelled, closed by the consumer, or failed
            status = status_of(exc)
            await self._involved.abort_all()
            raise
        finally:
            worker = self._decoder.worker_id if self._decoder else ""
            self.observer.on_finish(self._tally.result(worker, status))
            self._kv_wait.wake()

    async def _disaggregated(self, prefill: LiveWorker) -> AsyncGenerator[Chunk, None]:
        decoder = await self._reserve()
        self._involved.add(prefill)
        request = pb.PrefillRequest(
            request_id=self.plan.request_id,
            prompt_token_ids=self.plan.prompt_token_ids,
            params=self.plan.params,
            cache_salt=self.plan.cache_salt,
        )
        if (target := self._reserver.push_target) is not None:
            request.push_target.CopyFrom(target)
        call = prefill.stub.Prefill(request, timeout=self.plan.time_left())
        try:
            reply = await call.read()
        except grpc.aio.AioRpcError as exc:
            if exc.code() not in TRY_ELSEWHERE:
                raise
            log.info("prefill worker %s did not take %s (%s): the decode side prefills it",
                     prefill.worker_id, self.plan.request_id, exc.code().name)  # fmt: skip
            await self._involved.leave([prefill, decoder])  # a local Generate reuses the request id
            self._tally.mode = "local"
            async for chunk in self._generate_anywhere(decoder, None):
                yield chunk
            return
        if not isinstance(reply, pb.PrefillReply):  # grpc.aio.EOF: the stream ended empty
            raise unavailable(f"prefill worker {prefill.worker_id} answered no token")
        tally = self._tally
        tally.prefilled(prefill.worker_id, reply.usage)
        self.observer.on_transfer("write", reply.transfer)
        tally.first_token("disagg", prefill.worker_id)
        tally.completion_tokens = 1
        finish = tally.finish_reason(reply.finish_reason)
        got = (reply.logprob,) if reply.HasField("logprob") else ()
        params, pid = self.plan.params, prefill.worker_id
        logprobs = checked_logprobs(got, 1, params, "logprobs", pid)
        if finish is not None:
            call.cancel()  # a push still running is of no use now
            await self._involved.abort([decoder])  # nothing to decode: free the reservation now
            yield Chunk(reply.text, (reply.first_token,), finish, tally.usage(), logprobs)
            return
        yield Chunk(reply.text, (reply.first_token,), logprobs=logprobs)
        pushed = await self._pushed(call, decoder)
        async for chunk in self._generate_anywhere(decoder, reply.first_token, pushed):
            yield chunk

    async def _pushed(self, call: PrefillCall, decoder: LiveWorker) -> list[bytes]:
        """The rest of the prefill's answer, after its first token: the metas of a direct
        push that succeeded (none: the decode worker reads the pool; a push that failed, or
        a prefill worker lost before saying, is logged)."""
        rid, result = self.plan.request_id, None
        try:  # read(), as for the first message: gRPC refuses iterating after a read
            while isinstance(more := await call.read(), pb.PrefillReply):
                self.observer.on_transfer("write", more.transfer)
                result = more.push if more.HasField("push") else result
        except grpc.aio.AioRpcError as exc:
            log.warning("the prefill of %s ended before its push was answered (%s): it goes "
                        "through the pool", rid, exc.code().name)  # fmt: skip
            self.observer.on_handoff("push_failed")
            return []
        if result is None:
            self.observer.on_handoff("pool")
            return []
        if not result.ok:
            log.info("the KV push of %s to %s failed (%s): it goes through the pool",
                     rid, decoder.worker_id, result.error)  # fmt: skip
            self.observer.on_handoff("push_failed")
            return []
        self.observer.on_handoff("push")
        return list(result.metas)

    async def _local(self) -> AsyncGenerator[Chunk, None]:
        if self._decoder is None:
            raise unavailable("no worker can serve this request now")
        await self._take_turn_local()
        async for chunk in self._generate_anywhere(self._decoder, None):
            yield chunk

    async def _generate_anywhere(
        self, first: LiveWorker, first_token: int | None, pushed: list[bytes] | None = None
    ) -> AsyncGenerator[Chunk, None]:
        """``Generate`` on ``first``; when a decode worker does not take the call or fails
        mid-stream (:data:`TRY_ELSEWHERE`: it died, froze past the keepalive, or is
        draining), the request moves to the next decode candidate. It resumes there after
        the output tokens the client already has (their KV comes from the pool where the
        pool has it, the rest is recomputed), so the stream has no gap and no duplicate.
        A candidate that failed before its first chunk (say, its channel was still redialing
        a worker unreachable for a moment) is asked once more after every other one. With no
        candidate left the last error is raised (the client gets an error event). ``pushed``
        (metas of a direct push into ``first``'s pages) goes to ``first``'s first call only."""
        outputs: list[int] = [] if first_token is None else [first_token]
        tried: set[str] = set()
        again: set[str] = set()  # failed before their first chunk, not yet asked again
        worker: LiveWorker | None = first
        while worker is not None:
            second = worker.worker_id in tried
            tried.add(worker.worker_id)
            again.discard(worker.worker_id)
            resume = outputs if len(outputs) > (first_token is not None) else None
            took = False
            try:
                metas = pushed if worker is first and not second else None
                async for chunk in self._generate(worker, first_token, resume, metas):
                    took = True
                    outputs.extend(chunk.token_ids)
                    yield chunk
                return
            except grpc.aio.AioRpcError as exc:
                if exc.code() not in TRY_ELSEWHERE:
                    raise
                if not took and not second:
                    again.add(worker.worker_id)
                nxt = await self._candidates.renewed(worker, exc)
                nxt = nxt or self._candidates.next_untried(tried, again)
                if nxt is None:
                    raise
                self._log_move(worker, nxt, exc, len(outputs) - (first_token is not None))
                await self._involved.leave([worker])
                worker = nxt

    def _log_move(
        self, old: LiveWorker, new: LiveWorker, exc: grpc.aio.AioRpcError, sent: int
    ) -> None:
        """Log a move to another decode worker; one after output counts as a migration (a
        worker asked once more is no move)."""
        rid, code = self.plan.request_id, exc.code().name
        if new.worker_id == old.worker_id:
            log.info("decode worker %s did not take %s (%s): asking it once more",
                     old.worker_id, rid, code)  # fmt: skip
            return
        if sent <= 0:
            log.info("decode worker %s did not take %s (%s): trying %s",
                     old.worker_id, rid, code, new.worker_id)  # fmt: skip
            return
        self._tally.migrations += 1
        self.observer.on_migrate(old.worker_id, new.worker_id)
        log.warning("decode worker %s failed on %s after %d tokens (%s): resuming on %s",
                    old.worker_id, rid, sent, code, new.worker_id)  # fmt: skip

    async def _reserve(self) -> LiveWorker:
        """The decode worker holding pages for the prompt (:mod:`router.flow.reservation`); it
        becomes the flow's decoder as soon as it holds them."""

        async def attempt() -> LiveWorker | None:
            holder = await self._reserver.reserve_once()
            if holder is not None:
                self._decoder = holder
            return holder

        return await self._reserver.take_turn(attempt)

    async def _take_turn_local(self) -> None:
        """A local request's turn in the router's KV queue: its turn is all it waits for
        (the worker that prefills it queues it for pages by itself)."""

        async def no_reservation_needed() -> bool:
            return True

        await self._reserver.take_turn(no_reservation_needed)

    async def _generate(
        self,
        worker: LiveWorker,
        first_token: int | None,
        resume: list[int] | None = None,
        pushed: list[bytes] | None = None,
    ) -> AsyncIterator[Chunk]:
        """:func:`router.flow.stream.generate_chunks` on ``worker``, now the flow's decoder
        and among the workers it touched."""
        self._involved.add(worker)
        self._decoder = worker
        async for chunk in generate_chunks(self._tally, worker, first_token, resume, pushed):
            yield chunk
