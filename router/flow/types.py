"""What a request flow (:mod:`router.flow.run`) takes and gives: wire sampling parameters,
chunks, its final :class:`FlowResult`, the :class:`FlowObserver` it reports to, and how a
worker's gRPC error reaches the client."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import grpc

from proto import worker_pb2 as pb
from router.errors import APIError, unavailable

TRY_ELSEWHERE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.FAILED_PRECONDITION})
"""Codes of a worker that did not take a call: it is draining for a role change
(UNAVAILABLE), its role changed before the router saw it (FAILED_PRECONDITION), or it cannot
be reached. Before any output came, the flow takes the request elsewhere."""


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int


@dataclass(frozen=True)
class Chunk:
    """New text and tokens; on the last chunk, ``finish_reason`` and ``usage`` are set.
    ``logprobs``: one per token, when asked for; ``prompt_logprobs``: on the first chunk of
    a request that asked, prompt tokens 2.. (the first has none)."""

    text: str
    token_ids: tuple[int, ...]
    finish_reason: str | None = None
    usage: Usage | None = None
    logprobs: tuple[pb.TokenLogprob, ...] = ()
    prompt_logprobs: tuple[pb.TokenLogprob, ...] = ()


@dataclass(frozen=True)
class FlowResult:
    """How a flow ended.

    ``mode``: ``disagg`` or ``local`` (as it ran: a refused remote prefill falls back to
    local); ``worker_id``: the worker that decoded ('' if none); ``status``: ``ok``,
    ``error``, ``timeout`` or ``cancelled``; ``e2e_s`` / ``ttft_s``: seconds from arrival
    to the end / to the first token (None: no token came); ``output_tokens``: tokens sent;
    ``migrations``: times the request moved to another decode worker after output began;
    ``prompt_tokens``: the prompt's length; ``finish_reason``: the client's finish reason
    (None: the flow ended without one).
    """

    mode: str
    worker_id: str
    status: str
    e2e_s: float
    ttft_s: float | None
    output_tokens: int
    migrations: int = 0
    prompt_tokens: int = 0
    finish_reason: str | None = None

    @property
    def tpot_s(self) -> float | None:
        """Time per output token after the first, ``(e2e - ttft) / (tokens - 1)``; None
        without a first token or with fewer than 2 tokens."""
        if self.ttft_s is None or self.output_tokens < 2:
            return None
        return max(0.0, self.e2e_s - self.ttft_s) / (self.output_tokens - 1)


class FlowObserver(Protocol):
    """What a flow reports, as it happens (metrics, cache statistics, SLO window)."""

    def on_prefill(self, worker_id: str, usage: pb.PromptUsage, predicted: int | None) -> None:
        """``predicted``: the local hit the router's index predicted (None: none)."""

    def on_transfer(self, direction: str, transfer: pb.Transfer) -> None: ...
    def on_first_token(self, mode: str, worker_id: str, seconds: float) -> None: ...
    def on_chunk(self, mode: str, worker_id: str, gap_s: float, tokens: int) -> None: ...
    def on_migrate(self, from_worker: str, to_worker: str) -> None: ...
    def on_handoff(self, path: str) -> None:
        """How a prefill's KV went to the decode worker: ``push``, ``push_failed``, ``pool``."""

    def on_finish(self, result: FlowResult) -> None: ...


def sampling_params(
    max_tokens: int,
    temperature: float,
    top_p: float,
    top_k: int,
    seed: int | None,
    stop: Sequence[str],
    ignore_eos: bool = False,
    *,
    stop_token_ids: Sequence[int] = (),
    logit_bias: Mapping[int, float] | None = None,
    presence_penalty: float = 0.0,
    frequency_penalty: float = 0.0,
    repetition_penalty: float = 1.0,
    min_tokens: int = 0,
    logprobs: int | None = None,
    prompt_logprobs: int | None = None,
) -> pb.SamplingParams:
    """The wire form of an OpenAI request's sampling fields (top_k <= 0 means off; a
    ``repetition_penalty`` of 1, off, is left unset; ``logprobs`` / ``prompt_logprobs``
    None: not asked for, left unset)."""
    params = pb.SamplingParams(
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=top_p,
        top_k=max(0, top_k),
        stop=list(stop),
        ignore_eos=ignore_eos,
        stop_token_ids=list(stop_token_ids),
        logit_bias=logit_bias or {},
        presence_penalty=presence_penalty,
        frequency_penalty=frequency_penalty,
        min_tokens=min_tokens,
    )
    if seed is not None:
        params.seed = seed
    if repetition_penalty != 1:
        params.repetition_penalty = repetition_penalty
    if logprobs is not None:
        params.logprobs = logprobs
    if prompt_logprobs is not None:
        params.prompt_logprobs = prompt_logprobs
    return params


def status_of(exc: BaseException) -> str:
    """The :attr:`FlowResult.status` of a flow that ended by ``exc``."""
    if isinstance(exc, asyncio.CancelledError | GeneratorExit):
        return "cancelled"
    if isinstance(exc, APIError) and exc.status == 504:
        return "timeout"
    return "error"


def rpc_error(exc: grpc.aio.AioRpcError) -> APIError:
    """The client-facing error for a failed worker call."""
    code = exc.code()
    detail = exc.details() or code.name
    if code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.OUT_OF_RANGE):
        return APIError(400, f"a worker rejected the request: {detail}")
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return APIError(504, "the request timed out", None, "timeout")
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED):
        return unavailable(f"a worker is unavailable: {detail}")
    return APIError(500, f"a worker failed: {detail}")


def checked_logprobs(
    values: Sequence[pb.TokenLogprob],
    count: int,
    params: pb.SamplingParams,
    field: Literal["logprobs", "prompt_logprobs"],
    worker_id: str,
) -> tuple[pb.TokenLogprob, ...]:
    """A worker's logprobs for ``count`` tokens of a request whose ``params`` ask (or not)
    for ``field``: ``count`` entries of at most the asked alternatives each, or none when
    none was asked; 502 for any other shape, so a worker's bad answer fails its own request,
    never the router."""
    wanted = getattr(params, field) if params.HasField(field) else None
    if wanted is None and not values:
        return ()
    ok = (
        wanted is not None
        and len(values) == count
        and all(len(v.top_ids) == len(v.top_logprobs) <= wanted for v in values)
    )
    if not ok:
        raise APIError(502, f"worker {worker_id} returned logprobs of the wrong shape")
    return tuple(values)
