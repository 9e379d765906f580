"""The ``Worker`` gRPC service: the router's verbs on one engine (see ``proto/worker.proto``).

Each RPC runs as a coroutine on the server's event loop and talks to the engine only
through :class:`workers.engine_loop.EngineLoop`: calls run on the engine thread, and the
fixed facts it needs (model length, pool joined) come from ``EngineLoop.info``
(:mod:`workers.engine_info`). Outputs of a request come back through
an asyncio queue fed from the engine thread. A request whose RPC ends early (the router
cancelled it, its deadline passed, the connection dropped) is aborted on the engine, so
its pages come back. Which verbs a worker takes depends on its role:

- ``prefill``: ``Prefill``;
- ``decode``: ``Reserve``, ``Generate`` (with ``first_token``, or without for a prompt
  the router keeps local). ``Reserve`` answers ``ok=False`` when the pages are not free now
  (the router's request waits and asks again), and fails with INVALID_ARGUMENT when the
  request can never be reserved here (e.g. it needs more pages than the whole cache);
- ``mixed``: all of them.

A role change (``SetRole``) drains first: new work is refused with ``UNAVAILABLE`` while
the worker finishes what it holds (its running requests, and its reservations: the
``Generate`` that takes one over is part of what it holds, so it is let in), then the role
switches. A ``SetRole`` cancelled while draining (its deadline passed, the caller left)
ends the drain and leaves the role as it was. Role changes run one at a time, in the order
they came: a second waits for the first to finish (or be cancelled), then drains anew if
its role differs from the one the first left.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from kvpool.landing import STALL_S
from proto import worker_pb2 as pb
from proto import worker_pb2_grpc
from proto.limits import MAX_CACHE_SALT_CHARS, MAX_LEASE_S, request_id_error
from proto.records import ROLES
from workers.engine import Engine
from workers.engine_info import EngineLoad
from workers.engine_loop import EngineLoop
from workers.kv_transfer import Transfer
from workers.outputs import RequestOutput
from workers.sequence import FinishReason
from workers.wire import finish_reason, load_report, sampling_params, transfer, usage

log = logging.getLogger(__name__)
Request = pb.ReserveRequest | pb.PrefillRequest | pb.GenerateRequest

ACCEPTS = {
    "Prefill": ("prefill", "mixed"),
    "Reserve": ("decode", "mixed"),
    "Generate": ("decode", "mixed"),
}
DRAIN_POLL_S = 0.05
LANDING_WAIT_S = 10.0
"""Hard cap on the wait for a landing after its prefill answered. The wait ends sooner when
the landing is over or stalls (no new object or meta for :data:`kvpool.landing.STALL_S`:
what is missing will not come); this bounds one that keeps trickling. Either way it is
cancelled then, keeping the leading blocks it verified, and the engine recomputes the rest."""


def _failure(out: RequestOutput | None) -> str:
    """The INTERNAL status detail for a request the engine failed on (``None``: the whole
    engine failed and dropped it)."""
    if out is None or out.error is None:
        return "the engine failed"
    return f"the engine failed on this request: {out.error}"


def aborted(request_id: str) -> RequestOutput:
    """The last output of a request ended by an ``Abort`` call while its own call was open."""
    return RequestOutput(request_id, [], [], [], finished=True, finish_reason=FinishReason.ABORT)


async def _delivered(
    out: RequestOutput | None, context: grpc.aio.ServicerContext[Any, Any]
) -> RequestOutput:
    """``out``, or the call aborted: INTERNAL if the engine failed on the request, ABORTED if
    an ``Abort`` call ended it."""
    if out is None or out.error is not None:
        await context.abort(grpc.StatusCode.INTERNAL, _failure(out))
    if out.finish_reason is FinishReason.ABORT and not out.new_token_ids:
        await context.abort(grpc.StatusCode.ABORTED, "the request was aborted (Abort)")
    return out


class WorkerServicer(worker_pb2_grpc.WorkerServicer):
    def __init__(self, loop: EngineLoop, role: str, on_change: Callable[[], None]) -> None:
        self.loop = loop
        self.role = role
        self.draining = False
        self.on_change = on_change
        """Called (on a thread) after the role or the drain state changed (re-publishes the
        record)."""
        self._role_lock = asyncio.Lock()

    async def _admit(
        self, verb: str, context: grpc.aio.ServicerContext[Any, Any], held: bool = False
    ) -> None:
        """Abort the call unless this role takes ``verb`` and the worker is not draining
        (``held``: the call finishes work the worker already holds, taken even so)."""
        if self.draining and not held:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "worker is draining")
        if self.role not in ACCEPTS[verb]:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION, f"a {self.role} worker does not take {verb}"
            )

    async def _check(self, request: Request, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        """Abort the call with INVALID_ARGUMENT unless its request id is well-formed and its
        token lists and cache salt fit this worker, checked before any list is copied."""
        if error := request_id_error(request.request_id):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, error)
        if len(request.cache_salt) > MAX_CACHE_SALT_CHARS:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"cache_salt must be at most {MAX_CACHE_SALT_CHARS} characters",
            )
        limit = self.loop.info.max_model_len
        tokens = len(request.prompt_token_ids)
        if isinstance(request, pb.GenerateRequest):
            tokens += len(request.resume_token_ids)
        if tokens > limit:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"the request has {tokens} tokens; this worker's model length is {limit}",
            )

    async def _on_engine(self, fn: Callable[[Engine], Any]) -> Any:
        return await asyncio.wrap_future(self.loop.call(fn))

    async def _start(
        self,
        request_id: str,
        fn: Callable[[Engine], Any],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> tuple[Any, asyncio.Queue[RequestOutput | None]]:
        """Add a request on the engine with a queue for its outputs; invalid input aborts
        the RPC with INVALID_ARGUMENT."""
        aio = asyncio.get_running_loop()
        outputs: asyncio.Queue[RequestOutput | None] = asyncio.Queue()

        def sink(out: RequestOutput | None) -> None:
            aio.call_soon_threadsafe(outputs.put_nowait, out)

        try:
            result = await asyncio.wrap_future(self.loop.start_request(request_id, sink, fn))
        except ValueError as exc:
            log.warning("refused %s: %s", request_id, exc)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return result, outputs

    async def _cancel(self, request_id: str) -> None:
        def abort(engine: Engine) -> bool:
            self.loop.detach(request_id)
            return engine.abort(request_id)

        await asyncio.shield(self._on_engine(abort))

    # -- verbs --------------------------------------------------------------------------------
    async def Reserve(
        self, request: pb.ReserveRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.ReserveReply:
        await self._admit("Reserve", context)
        await self._check(request, context)
        if request.lease_ms > MAX_LEASE_S * 1000:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"lease_ms must be at most {MAX_LEASE_S * 1000:g}"
            )
        prompt = list(request.prompt_token_ids)
        lease = (request.lease_ms or 30_000) / 1000

        def reserve(engine: Engine) -> pb.ReserveReply:
            seq = engine.reserve(
                request.request_id, prompt, request.max_tokens, lease, request.cache_salt
            )
            if seq is None:
                return pb.ReserveReply(ok=False, reason="no free KV pages now")
            return pb.ReserveReply(
                ok=True, num_pages=len(seq.block_table), local_tokens=seq.num_cached_tokens
            )

        try:
            reply: pb.ReserveReply = await self._on_engine(reserve)
        except ValueError as exc:  # can never be reserved here: larger than the cache, ...
            log.warning("refused to reserve for %s: %s", request.request_id, exc)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return reply

    async def Prefill(
        self, request: pb.PrefillRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.PrefillReply:
        await self._admit("Prefill", context)
        await self._check(request, context)
        params = await self._params(request.params, context)
        prompt = list(request.prompt_token_ids)
        try:  # a cancel while starting still aborts: the engine runs calls in order
            _, outputs = await self._start(
                request.request_id,
                lambda e: e.add_request(
                    prompt, params, request.request_id, handoff=True, cache_salt=request.cache_salt
                ),
                context,
            )
            out = await outputs.get()
        except asyncio.CancelledError:
            await self._cancel(request.request_id)
            raise
        out = await _delivered(out, context)
        return pb.PrefillReply(
            first_token=out.new_token_ids[0],
            text=out.text_delta,
            finish_reason=finish_reason(out.finish_reason),
            usage=usage(out),
            transfer=transfer(out.transfer),
        )

    async def Generate(
        self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[pb.TokenChunk]:
        rid = request.request_id
        held = (
            self.draining
            and request.HasField("first_token")
            and await self._on_engine(lambda e: e.holds(rid))
        )
        await self._admit("Generate", context, held)
        await self._check(request, context)
        params = await self._params(request.params, context)
        try:  # from the landing wait on: a cancel anywhere aborts the request
            started, outputs = await self._start(
                rid, await self._generate_start(request, params), context
            )
            read = started if isinstance(started, Transfer) else None
            first_chunk = True
            while True:
                out = await _delivered(await outputs.get(), context)
                chunk = pb.TokenChunk(
                    token_ids=out.new_token_ids,
                    text=out.text_delta,
                    finish_reason=finish_reason(out.finish_reason),
                )
                if first_chunk:
                    chunk.usage.CopyFrom(usage(out))
                    chunk.transfer.CopyFrom(transfer(read))
                    first_chunk = False
                yield chunk
                if out.finished:
                    return
        except asyncio.CancelledError:
            await self._cancel(rid)
            raise

    async def _generate_start(
        self, request: pb.GenerateRequest, params: Any
    ) -> Callable[[Engine], Any]:
        """How a ``Generate`` starts on the engine: resumed after the outputs the client
        has, adopted after a remote prefill (its landing let finish first, while it makes
        progress: see :data:`LANDING_WAIT_S`), or new."""
        rid, salt = request.request_id, request.cache_salt
        prompt = list(request.prompt_token_ids)
        if request.resume_token_ids:
            resumed = list(request.resume_token_ids)
            return lambda e: e.resume(rid, prompt, resumed, params, salt)
        if request.HasField("first_token"):
            first = request.first_token
            landing = await self._on_engine(lambda e: e.prefill_answered(rid))
            if landing is not None:  # wait off the engine thread; decodes go on meanwhile
                await asyncio.to_thread(landing.settle, STALL_S, LANDING_WAIT_S)
            return lambda e: e.adopt(rid, prompt, first, params, salt)
        return lambda e: e.add_request(prompt, params, rid, cache_salt=salt)

    async def _params(
        self, msg: pb.SamplingParams, context: grpc.aio.ServicerContext[Any, Any]
    ) -> Any:
        try:
            return sampling_params(msg)
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))

    async def Abort(
        self, request: pb.AbortRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.AbortReply:
        rid = request.request_id
        if request_id_error(rid):
            return pb.AbortReply(found=False)  # no such request can exist here

        def abort(engine: Engine) -> bool:
            sink = self.loop.detach(rid)
            found = engine.abort(rid)
            if sink is not None:  # its call is still open: end it, do not leave it hanging
                sink(aborted(rid))
            return found

        return pb.AbortReply(found=await self._on_engine(abort))

    async def GetLoad(
        self, request: pb.LoadRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.LoadReport:
        load: EngineLoad = await self._on_engine(lambda e: e.load())
        return load_report(load, self.role, self.draining)

    async def SetRole(
        self, request: pb.SetRoleRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.SetRoleReply:
        if request.role not in ROLES:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"role must be one of {ROLES}")
        if request.role != "mixed" and not self.loop.info.pool_attached:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION, f"role {request.role} needs the KV pool"
            )
        async with self._role_lock:  # one change at a time, in arrival order
            previous = self.role
            if request.role != previous:
                await self._change_role(request.role)
        return pb.SetRoleReply(role=self.role, previous=previous)

    async def _change_role(self, role: str) -> None:
        """Drain, then switch to ``role`` (see the module docstring); the record is
        re-published off the event loop (it reads the load and writes Redis)."""
        previous = self.role
        self.draining = True
        await asyncio.to_thread(self.on_change)
        try:
            while await self._on_engine(lambda e: e.busy):
                await asyncio.sleep(DRAIN_POLL_S)
        except asyncio.CancelledError:
            self.draining = False
            await asyncio.shield(asyncio.to_thread(self.on_change))
            log.info("role change to %s cancelled: still %s", role, previous)
            raise
        self.role, self.draining = role, False
        await asyncio.to_thread(self.on_change)
        log.info("role changed from %s to %s", previous, self.role)
