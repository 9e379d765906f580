"""The ``Worker`` gRPC service over vLLM's engine (see ``proto/worker.proto``): the router's
verbs as our engine answers them, so the router, placement, the pool hand-off, admission,
the P:D controller and ``kvserve chaos`` work with either engine.

- ``Reserve``: pages promised against vLLM's free pages under a lease
  (:mod:`vllm_backend.reservations`), with the prompt tokens this worker's cache holds
  (vLLM's cache under our names: :mod:`vllm_backend.cache_names`). No direct push: vLLM's
  pages are not ours to offer, so the router's push falls back to the pool;
- ``Prefill``: the prompt run for one token, its KV written to the pool by the connector
  as it is computed (its last step waits for the metas: a decode worker looks the prompt
  up once); answers the first token, its text, usage and the KV written. A push target is
  answered with a failed push (the KV is in the pool);
- ``Generate``: after a remote prefill, the prompt and its first token: the connector loads
  the prompt from the pool (its partial last block too), vLLM computes the first token's KV
  and decodes; resumed after outputs the client has; or from the prompt. Text, stop
  strings and finish reasons as our engine's (:mod:`vllm_backend.outputs`);
- ``Abort``: aborts the request in vLLM and ends its reservation; ``GetLoad``: the load
  report (:mod:`vllm_backend.state`); ``SetRole``:
  :class:`workers.serve.servicer_base.ServicerBase`.

A call that ends early (the router cancelled it, its deadline passed) aborts its request in
vLLM, so its pages come back.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass

import grpc
from vllm.v1.engine.exceptions import EngineDeadError

from kvpool.hashing import PrefixHasher
from proto import worker_pb2 as pb
from proto.limits import request_id_error
from proto.tokenization import Tokenizer
from vllm_backend.args import sampling_kwargs
from vllm_backend.cache_names import CacheNames
from vllm_backend.engine import VllmEngine
from vllm_backend.outputs import CallOutputs, prompt_logprobs
from vllm_backend.plans import ADOPT, HANDOFF, RID
from vllm_backend.reservations import ReservationBook
from vllm_backend.state import WorkerState
from workers.core.engine_info import EngineLoad
from workers.core.outputs import RequestOutput
from workers.core.sequence import SamplingParams
from workers.serve.rpc_edge import delivered, lease_seconds
from workers.serve.servicer_base import Context, ServicerBase
from workers.serve.wire import load_report, prefill_reply, token_chunk, transfer, usage

log = logging.getLogger(__name__)
ADMIT_WAIT_S = 1.0
"""Longest wait for the connector's report of a request's pool tokens (module docstring of
:mod:`vllm_backend.reports`: it is sent before the request's first step)."""
NO_PUSH = "a vLLM-backed worker does not push: the prompt's KV is in the pool"


@dataclass
class Call:
    """What one call asks vLLM: ``tokens`` (prompt, then output tokens made elsewhere),
    their text state, and the connector's ``kv_transfer_params``."""

    request_id: str
    kind: str
    prompt: list[int]
    earlier: list[int]
    salt: str
    params: SamplingParams
    transfer: dict[str, object]
    handoff: bool = False

    @property
    def internal_id(self) -> str:
        return f"{self.request_id}#{self.kind}"


class VllmServicer(ServicerBase):
    def __init__(
        self,
        engine: VllmEngine,
        state: WorkerState,
        names: CacheNames,
        hasher: PrefixHasher,
        tokenizer: Tokenizer,
        role: str,
        max_model_len: int,
        block_tokens: int,
    ) -> None:
        super().__init__(role, lambda: None, max_model_len, bool(state.pool_attached))
        self.engine, self.state, self.names = engine, state, names
        self.hasher, self.tokenizer, self.block_tokens = hasher, tokenizer, block_tokens
        self.book = ReservationBook(state.total_pages, block_tokens)
        self._live: dict[str, set[str]] = {}
        """Router request id -> vLLM request ids running for it."""

    # -- the engine ------------------------------------------------------------------------
    async def _claim(self, call: Call, context: Context) -> None:
        """Mark ``call`` running (until :meth:`_release`), or refuse it when a call of the
        same request and kind is open (before anything of the open one can be touched)."""
        live = self._live.setdefault(call.request_id, set())
        if call.internal_id in live:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "request id in use")
        live.add(call.internal_id)

    def _release(self, call: Call) -> None:
        live = self._live.get(call.request_id, set())
        live.discard(call.internal_id)
        if not live:
            self._live.pop(call.request_id, None)

    async def _run(self, call: Call, context: Context) -> AsyncGenerator[RequestOutput, None]:
        """Our outputs of ``call`` (claimed: :meth:`_claim`; the first carries usage facts),
        vLLM's request aborted unless it finished by itself. The call ends INTERNAL when
        vLLM failed on the request, ABORTED when an ``Abort`` ended it before a token, and
        UNAVAILABLE when vLLM's engine died (this worker then stops: its supervisor, or the
        controller, replaces it)."""
        internal = call.internal_id
        remaining = call.params.max_tokens - len(call.earlier)
        tokens = [*call.prompt, *call.earlier]
        outputs = CallOutputs(
            call.request_id, self.tokenizer.stream(), call.params, call.prompt, call.earlier,
            handoff_within=self.max_model_len if call.handoff else 0,
        )  # fmt: skip
        cap = 1 if call.handoff else remaining
        min_tokens = max(0, call.params.min_tokens - len(call.earlier))
        sampling = sampling_kwargs(call.params, cap, min_tokens, call.transfer)
        self.state.open(call.request_id)
        self.state.queued_prefill_tokens += len(tokens)
        done, first = False, True
        try:
            async for out in self.engine.run(internal, tokens, call.salt, sampling):
                completion = out.outputs[0]
                reason = completion.finish_reason if out.finished else None
                step = outputs.step(completion.token_ids, completion.logprobs, reason)
                if reason == "error":
                    step.error = "vLLM failed on it"
                done = out.finished
                step = await delivered(step, context)
                if first:
                    first = False
                    self.state.queued_prefill_tokens -= len(tokens)
                    await self._facts(call, out, step)
                yield step
                if step.finished:
                    return
        except EngineDeadError:
            log.error("vLLM's engine died: this worker stops")
            os.kill(os.getpid(), signal.SIGTERM)
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the engine died")
        except ValueError as exc:  # vLLM refused the request (a token id, a length, ...)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        finally:
            if first:
                self.state.queued_prefill_tokens -= len(tokens)
            if not done:
                with contextlib.suppress(Exception):  # a dead engine has nothing to free
                    await self.engine.abort([internal])
        await context.abort(grpc.StatusCode.INTERNAL, "vLLM ended the request without a finish")

    async def _facts(self, call: Call, out: object, step: RequestOutput) -> None:
        """Put the prompt's usage on the first output: vLLM's cached tokens (counted when it
        admitted the request) less those of the pool's that failed to arrive (recomputed),
        of which the pool's (the connector's reports), and count them."""
        prompt = len(call.prompt)
        planned, arrived = await self.state.pool_tokens(call.request_id, ADMIT_WAIT_S)
        vllm_cached = int(getattr(out, "num_cached_tokens", 0) or 0) - (planned - arrived)
        cached = max(0, min(vllm_cached, prompt))
        pool = min(arrived, cached)
        step.num_cached_tokens, step.num_pool_tokens = cached, pool
        self.state.account(prompt, cached - pool, pool)
        k = call.params.prompt_logprobs
        entries = getattr(out, "prompt_logprobs", None)
        if k is not None and entries:
            step.prompt_logprobs = prompt_logprobs(call.prompt, entries, k)

    # -- verbs -----------------------------------------------------------------------------
    async def Reserve(self, request: pb.ReserveRequest, context: Context) -> pb.ReserveReply:
        await self._admit("Reserve", context)
        await self._check(request, context)
        await self._check_lease(request, context)
        prompt = list(request.prompt_token_ids)
        used = round(self.state.usage * self.state.total_pages)
        try:
            pages = self.book.reserve(
                request.request_id, len(prompt), request.max_tokens,
                lease_seconds(request.lease_ms), self.state.total_pages - used,
            )  # fmt: skip
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        if pages is None:
            return pb.ReserveReply(ok=False, reason="no free KV pages now")
        usable = (len(prompt) - 1) // self.block_tokens
        root = self.hasher.root(request.cache_salt)
        chain = self.hasher.chain(prompt[: usable * self.block_tokens], self.block_tokens, root)
        local = self.names.holds(chain) * self.block_tokens
        return pb.ReserveReply(ok=True, num_pages=pages, local_tokens=local)

    async def Prefill(
        self, request: pb.PrefillRequest, context: Context
    ) -> AsyncIterator[pb.PrefillReply]:
        await self._admit("Prefill", context)
        await self._check(request, context)
        params = await self._params(request.params, context)
        rid = request.request_id
        call = Call(rid, "p", list(request.prompt_token_ids), [], request.cache_salt, params,
                    {RID: rid, HANDOFF: True}, handoff=True)  # fmt: skip
        await self._claim(call, context)
        try:
            async with contextlib.aclosing(self._run(call, context)) as outputs:
                out = await anext(outputs)
        finally:
            self._release(call)
            facts = self.state.forget(rid)
        out.transfer = facts.written
        yield prefill_reply(out)
        if request.HasField("push_target"):
            yield pb.PrefillReply(push=pb.PushResult(ok=False, error=NO_PUSH))

    async def Generate(
        self, request: pb.GenerateRequest, context: Context
    ) -> AsyncIterator[pb.TokenChunk]:
        rid = request.request_id
        adopting = request.HasField("first_token")
        held = self.draining and adopting and self.book.holds(rid)
        await self._admit("Generate", context, held)
        await self._check(request, context)
        params = await self._params(request.params, context)
        earlier: list[int] = []
        transfer_params: dict[str, object] = {RID: rid}
        if request.resume_token_ids:
            earlier = list(request.resume_token_ids)
        elif adopting:
            earlier = [request.first_token]
            transfer_params[ADOPT] = True
            self.book.take(rid)
        call = Call(rid, "g", list(request.prompt_token_ids), earlier, request.cache_salt,
                    params, transfer_params)  # fmt: skip
        first = True
        await self._claim(call, context)
        try:
            async with contextlib.aclosing(self._run(call, context)) as outputs:
                async for out in outputs:
                    chunk = token_chunk(out)
                    if first:
                        first = False
                        chunk.usage.CopyFrom(usage(out))
                        chunk.transfer.CopyFrom(transfer(self.state.open(rid).read))
                    yield chunk
                    if out.finished:
                        return
        finally:
            self._release(call)
            self.state.forget(rid)

    async def Abort(self, request: pb.AbortRequest, context: Context) -> pb.AbortReply:
        rid = request.request_id
        if request_id_error(rid):
            return pb.AbortReply(found=False)
        live = sorted(self._live.get(rid, ()))
        if live:  # its open call ends with an abort (vLLM's last output says so)
            await self.engine.abort(live)
        found = self.book.release(rid) or bool(live)
        return pb.AbortReply(found=found)

    async def GetLoad(self, request: pb.LoadRequest, context: Context) -> pb.LoadReport:
        return load_report(self.load(), self.role, self.draining)

    def load(self) -> EngineLoad:
        """This worker's load now (:meth:`vllm_backend.state.WorkerState.load`)."""
        return self.state.load(len(self.book), self.book.promised, idle=not self._live)

    async def _busy(self) -> bool:
        return bool(self._live) or len(self.book) > 0
