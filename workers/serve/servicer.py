"""The ``Worker`` gRPC service: the router's verbs on one engine (see ``proto/worker.proto``).

Each RPC runs as a coroutine on the server's event loop and talks to the engine only
through :class:`workers.engine.loop.EngineLoop`: calls run on the engine thread, and the
fixed facts it needs (model length, pool joined) come from ``EngineLoop.info``
(:mod:`workers.core.engine_info`). Outputs of a request come back through
an asyncio queue fed from the engine thread. A request whose RPC ends early (the router
cancelled it, its deadline passed, the connection dropped) is aborted on the engine, so
its pages come back.

Which verbs a role takes, and the drain of a role change (``SetRole``), are
:mod:`workers.serve.role_switch`; the checks of a call before the engine sees it and the status of
an engine output are :mod:`workers.serve.rpc_edge`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from kvpool.stream import Transfer
from proto import worker_pb2 as pb
from proto.limits import request_id_error
from workers.core.engine_info import EngineLoad
from workers.core.outputs import RequestOutput
from workers.engine.engine import Engine
from workers.engine.loop import EngineLoop
from workers.serve.rpc_edge import aborted, delivered, lease_seconds
from workers.serve.servicer_base import Context, ServicerBase
from workers.serve.wire import (
    load_report,
    prefill_reply,
    push_reply,
    push_target,
    push_target_msg,
    token_chunk,
    transfer,
    usage,
)

log = logging.getLogger(__name__)


class WorkerServicer(ServicerBase):
    def __init__(self, loop: EngineLoop, role: str, on_change: Callable[[], None]) -> None:
        super().__init__(role, on_change, loop.info.max_model_len, loop.info.pool_attached)
        self.loop = loop

    async def _on_engine(self, fn: Callable[[Engine], Any]) -> Any:
        return await asyncio.wrap_future(self.loop.call(fn))

    async def _start(
        self,
        request_id: str,
        fn: Callable[[Engine], Any],
        context: Context,
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
    async def Reserve(self, request: pb.ReserveRequest, context: Context) -> pb.ReserveReply:
        await self._admit("Reserve", context)
        await self._check(request, context)
        await self._check_lease(request, context)
        prompt = list(request.prompt_token_ids)
        lease = lease_seconds(request.lease_ms)

        def reserve(engine: Engine) -> pb.ReserveReply:
            rid, salt = request.request_id, request.cache_salt
            seq = engine.reserve(rid, prompt, request.max_tokens, lease, salt, request.offer_push)
            if seq is None:
                return pb.ReserveReply(ok=False, reason="no free KV pages now")
            reply = pb.ReserveReply(
                ok=True, num_pages=len(seq.block_table), local_tokens=seq.num_cached_tokens
            )
            if (target := engine.push_target(rid)) is not None:
                reply.push_target.CopyFrom(push_target_msg(target))
            return reply

        try:
            reply: pb.ReserveReply = await self._on_engine(reserve)
        except ValueError as exc:  # can never be reserved here: larger than the cache, ...
            log.warning("refused to reserve for %s: %s", request.request_id, exc)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return reply

    async def Prefill(
        self, request: pb.PrefillRequest, context: Context
    ) -> AsyncIterator[pb.PrefillReply]:
        """The first token at once; with a push target, how the push went when it is done
        (its last layers may still be on their way when the first token is answered)."""
        await self._admit("Prefill", context)
        await self._check(request, context)
        params = await self._params(request.params, context)
        prompt = list(request.prompt_token_ids)
        rid, salt = request.request_id, request.cache_salt
        target = (
            push_target(request.push_target, len(prompt))
            if request.HasField("push_target")
            else None
        )
        try:  # a cancel while starting still aborts: the engine runs calls in order
            _, outputs = await self._start(
                rid,
                lambda e: e.add_request(prompt, params, rid, True, salt, target),
                context,
            )
            out = await delivered(await outputs.get(), context)
            yield prefill_reply(out)
            if out.push is not None:
                yield push_reply(await asyncio.wrap_future(out.push))
        except asyncio.CancelledError:
            await self._cancel(request.request_id)
            raise

    async def Generate(
        self, request: pb.GenerateRequest, context: Context
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
                out = await delivered(await outputs.get(), context)
                chunk = token_chunk(out)
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
        has, adopted after a remote prefill (one call to the engine before the adoption:
        what arrived is waited for off its thread, :mod:`workers.handoff.arrival`), or new."""
        rid, salt = request.request_id, request.cache_salt
        prompt = list(request.prompt_token_ids)
        if request.resume_token_ids:
            resumed = list(request.resume_token_ids)
            return lambda e: e.resume(rid, prompt, resumed, params, salt)
        if request.HasField("first_token"):
            first, pushed = request.first_token, list(request.pushed_metas)
            arrival = await self._on_engine(lambda e: e.arrived(rid, bool(pushed)))
            verdict = None
            if arrival.waits:  # off the engine thread: decodes go on meanwhile
                verdict = await asyncio.to_thread(arrival.wait, pushed)
            return lambda e: e.adopt(rid, prompt, first, params, salt, verdict)
        return lambda e: e.add_request(prompt, params, rid, cache_salt=salt)

    async def Abort(self, request: pb.AbortRequest, context: Context) -> pb.AbortReply:
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

    async def GetLoad(self, request: pb.LoadRequest, context: Context) -> pb.LoadReport:
        load: EngineLoad = await self._on_engine(lambda e: e.load())
        return load_report(load, self.role, self.draining)

    async def _busy(self) -> bool:
        """Whether the engine holds any work (what a drain waits out)."""
        busy: bool = await self._on_engine(lambda e: e.busy)
        return busy
