"""What one request's flow has seen so far, and the ``Generate`` stream that feeds it.

:class:`FlowTally` is a flow's own record: how it was served (``mode``), its first token's
time, the tokens the client has, the prompt tokens that were cached, the moves to another
decode worker and the finish reason; it reports each event to the flow's observer as it
happens and gives the :class:`~router.flow.types.FlowResult` at the end.
:func:`generate_chunks` turns one ``Generate`` call on a worker into
:class:`~router.flow.types.Chunk`\\ s, counting into the tally. Lifecycle: one tally per
:class:`router.flow.run.RequestFlow`, made with it, read when it ends; used from its task only.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from proto import worker_pb2 as pb
from proto.finish import openai_finish
from router.errors import APIError, unavailable
from router.flow.plan import FlowPlan
from router.flow.types import Chunk, FlowObserver, FlowResult, Usage, checked_logprobs
from router.placement.live_worker import LiveWorker


class FlowTally:
    """One flow's record (module docstring); ``plan`` and ``observer`` are the flow's."""

    def __init__(self, plan: FlowPlan, observer: FlowObserver) -> None:
        self.plan = plan
        self.observer = observer
        self.mode = plan.mode
        self.cached_tokens = 0
        self.completion_tokens = 0
        self.ttft_s: float | None = None
        self.migrations = 0
        self.finish: str | None = None

    def first_token(self, mode: str, worker_id: str) -> None:
        self.ttft_s = self.plan.elapsed()
        self.observer.on_first_token(mode, worker_id, self.ttft_s)

    def prefilled(self, worker_id: str, usage: pb.PromptUsage) -> None:
        self.cached_tokens = usage.local_tokens + usage.pool_tokens
        self.observer.on_prefill(worker_id, usage, self.plan.predicted_local.get(worker_id))

    def finish_reason(self, reason: pb.FinishReason.ValueType) -> str | None:
        """The client's finish reason (:func:`proto.finish.openai_finish`: None while the
        request runs); 503 when the worker aborted it."""
        if reason == pb.FINISH_REASON_ABORT:
            raise unavailable("a worker aborted the request (draining or out of memory)")
        self.finish = openai_finish(reason)
        return self.finish

    def usage(self) -> Usage:
        return Usage(len(self.plan.prompt_token_ids), self.completion_tokens, self.cached_tokens)

    def result(self, worker_id: str, status: str) -> FlowResult:
        """The flow's end as its observer gets it."""
        return FlowResult(
            self.mode,
            worker_id,
            status,
            self.plan.elapsed(),
            self.ttft_s,
            self.completion_tokens,
            self.migrations,
            len(self.plan.prompt_token_ids),
            self.finish,
        )


async def generate_chunks(
    tally: FlowTally,
    worker: LiveWorker,
    first_token: int | None,
    resume: list[int] | None = None,
    pushed: list[bytes] | None = None,
) -> AsyncIterator[Chunk]:
    """Chunks of ``Generate`` on ``worker``: after a remote prefill (``first_token``, with
    the metas of a direct push into its pages, ``pushed``), resumed after the outputs the
    client has (``resume``, non-empty), or from the prompt (its first chunk is then the
    TTFT). A stream that ends before a finish reason is a 502."""
    plan = tally.plan
    request = pb.GenerateRequest(
        request_id=plan.request_id,
        prompt_token_ids=plan.prompt_token_ids,
        params=plan.params,
        cache_salt=plan.cache_salt,
    )
    if resume:
        request.resume_token_ids.extend(resume)
    elif first_token is not None:
        request.first_token = first_token
        request.pushed_metas.extend(pushed or ())
    call = worker.stub.Generate(request, timeout=plan.time_left())
    prompt, wid = len(plan.prompt_token_ids), worker.worker_id
    last = plan.clock()
    awaiting_prefill = first_token is None and not resume
    try:
        async for msg in call:
            now = plan.clock()
            prompt_logprobs: tuple[pb.TokenLogprob, ...] = ()
            if awaiting_prefill:
                awaiting_prefill = False
                prompt_logprobs = checked_logprobs(
                    msg.prompt_logprobs, prompt - 1, plan.params, "prompt_logprobs", wid
                )
                tally.prefilled(wid, msg.usage)
                tally.first_token("local", wid)
            elif msg.token_ids:
                tally.observer.on_chunk(tally.mode, wid, now - last, len(msg.token_ids))
            last = now
            if msg.HasField("transfer") and msg.transfer.bytes:
                tally.observer.on_transfer("read", msg.transfer)
            tally.completion_tokens += len(msg.token_ids)
            finish = tally.finish_reason(msg.finish_reason)
            usage = tally.usage() if finish else None
            ids = tuple(msg.token_ids)
            logprobs = checked_logprobs(msg.logprobs, len(ids), plan.params, "logprobs", wid)
            yield Chunk(msg.text, ids, finish, usage, logprobs, prompt_logprobs)
            if finish is not None:
                return
    finally:
        call.cancel()  # a no-op once the stream has ended
    raise APIError(502, f"worker {worker.worker_id} ended the stream before finishing")
