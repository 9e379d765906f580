"""The ``Worker`` gRPC service: the router's verbs on one engine (see ``proto/worker.proto``).

Each RPC runs as a coroutine on the server's event loop and talks to the engine only
through :class:`workers.engine_loop.EngineLoop`: calls run on the engine thread, and the
fixed facts it needs (model length, pool joined) come from ``EngineLoop.info``
(:mod:`workers.engine_info`). Outputs of a request come back through
an asyncio queue fed from the engine thread. A request whose RPC ends early (the router
cancelled it, its deadline passed, the connection dropped) is aborted on the engine, so
its pages come back.

Which verbs a role takes, and the drain of a role change (``SetRole``), are
:mod:`workers.role_switch`; the checks of a call before the engine sees it and the status of
an engine output are :mod:`workers.rpc_edge`.
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
from proto.limits import request_id_error
from proto.records import ROLES
from workers.engine import Engine
from workers.engine_info import EngineLoad
from workers.engine_loop import EngineLoop
from workers.kv_transfer import Transfer
from workers.outputs import RequestOutput
from workers.role_switch import RoleSwitch
from workers.rpc_edge import (
    Request,
    aborted,
    delivered,
    lease_error,
    lease_seconds,
    request_error,
)
from workers.wire import (
    finish_reason,
    load_report,
    logprobs,
    push_result,
    push_target,
    push_target_msg,
    sampling_params,
    transfer,
    usage,
)

log = logging.getLogger(__name__)
Context = grpc.aio.ServicerContext[Any, Any]
LANDING_WAIT_S = 10.0
"""Hard cap on the wait for a landing after its prefill answered. The wait ends sooner when
the landing is over or stalls (no new object or meta for :data:`kvpool.landing.STALL_S`:
what is missing will not come); this bounds one that keeps trickling. Either way it is
cancelled then, keeping the leading blocks it verified, and the engine recomputes the rest."""


class WorkerServicer(worker_pb2_grpc.WorkerServicer):
    def __init__(self, loop: EngineLoop, role: str, on_change: Callable[[], None]) -> None:
        self.loop = loop
        self.roles = RoleSwitch(role, on_change)
        """Role and drain (:mod:`workers.role_switch`)."""

    @property
    def role(self) -> str:
        return self.roles.role

    @property
    def draining(self) -> bool:
        return self.roles.draining

    @property
    def on_change(self) -> Callable[[], None]:
        """Called (on a thread) after the role or the drain state changed (re-publishes the
        record)."""
        return self.roles.on_change

    @on_change.setter
    def on_change(self, callback: Callable[[], None]) -> None:
        self.roles.on_change = callback

    async def _admit(self, verb: str, context: Context, held: bool = False) -> None:
        """Abort the call unless this role takes ``verb`` and the worker is not draining
        (``held``: the call finishes work the worker already holds, taken even so)."""
        if refusal := self.roles.refusal(verb, held):
            await context.abort(*refusal)

    async def _check(self, request: Request, context: Context) -> None:
        """Abort the call with INVALID_ARGUMENT unless its request id is well-formed and its
        token lists and cache salt fit this worker (:func:`workers.rpc_edge.request_error`)."""
        if error := request_error(request, self.loop.info.max_model_len):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, error)

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
        if error := lease_error(request.lease_ms):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, error)
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

    async def Prefill(self, request: pb.PrefillRequest, context: Context) -> pb.PrefillReply:
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
            out = await outputs.get()
        except asyncio.CancelledError:
            await self._cancel(request.request_id)
            raise
        out = await delivered(out, context)
        return pb.PrefillReply(
            first_token=out.new_token_ids[0],
            text=out.text_delta,
            finish_reason=finish_reason(out.finish_reason),
            usage=usage(out),
            transfer=transfer(out.transfer),
            logprob=logprobs(out.logprobs)[0] if out.logprobs else None,
            push=push_result(out.push) if out.push is not None else None,
        )

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
                chunk = pb.TokenChunk(
                    token_ids=out.new_token_ids,
                    text=out.text_delta,
                    finish_reason=finish_reason(out.finish_reason),
                    logprobs=logprobs(out.logprobs),
                    prompt_logprobs=logprobs(out.prompt_logprobs or ()),
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
            first, pushed = request.first_token, list(request.pushed_metas)
            landing = await self._on_engine(lambda e: e.prefill_answered(rid))
            if landing is not None:  # wait off the engine thread; decodes go on meanwhile
                await asyncio.to_thread(landing.settle, STALL_S, LANDING_WAIT_S)
            verdict = None
            check = await self._on_engine(lambda e: e.push_check(rid)) if pushed else None
            if check is not None:  # the pushed pages, checked off the engine thread too
                verdict = await asyncio.to_thread(check.run, pushed)
            return lambda e: e.adopt(rid, prompt, first, params, salt, verdict)
        return lambda e: e.add_request(prompt, params, rid, cache_salt=salt)

    async def _params(self, msg: pb.SamplingParams, context: Context) -> Any:
        try:
            return sampling_params(msg)
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))

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

    async def SetRole(self, request: pb.SetRoleRequest, context: Context) -> pb.SetRoleReply:
        if request.role not in ROLES:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"role must be one of {ROLES}")
        if request.role != "mixed" and not self.loop.info.pool_attached:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION, f"role {request.role} needs the KV pool"
            )
        previous = await self.roles.change(request.role, self._busy)
        return pb.SetRoleReply(role=self.role, previous=previous)

    async def _busy(self) -> bool:
        """Whether the engine holds any work (what a drain waits out)."""
        busy: bool = await self._on_engine(lambda e: e.busy)
        return busy
