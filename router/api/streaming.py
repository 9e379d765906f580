"""Running a flow for an HTTP client, so that a client that goes away cancels it.

- :func:`until_disconnected` awaits something while watching the connection; if the
  client disconnects first, the awaited task is cancelled (the flow aborts its request on
  every worker) and :class:`ClientGoneError` is raised.
- :func:`sse_events` turns a flow's chunks into server-sent events. Once the response has
  started, Starlette cancels the body iterator when the client disconnects, which
  cancels the flow at its current await, with the same abort.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Sequence
from typing import Any, TypeVar

from starlette.requests import Request

from router.api.responses import DONE, Formatter, joined_usage, sse
from router.errors import APIError
from router.flow.samples import Sample
from router.flow.types import Chunk, Usage

T = TypeVar("T")


class ClientGoneError(Exception):
    """The client disconnected before the answer was ready."""


async def _wait_disconnect(request: Request) -> None:
    # The body has been read, so the next message is the disconnect (or never comes).
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def until_disconnected(request: Request, awaitable: Awaitable[T]) -> T:
    task: asyncio.Future[Any] = asyncio.ensure_future(awaitable)
    watch: asyncio.Future[Any] = asyncio.ensure_future(_wait_disconnect(request))
    try:
        await asyncio.wait([task, watch], return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            result: T = task.result()
            return result
        raise ClientGoneError()
    finally:
        for pending in (watch, task):
            if not pending.done():
                pending.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await pending


def join(chunks: Sequence[Chunk]) -> Chunk:
    """One sample's whole answer as one chunk: every chunk's text, token ids and logprobs
    joined, in order, with the first chunk's prompt logprobs and the last one's finish
    reason and usage."""
    if not chunks:
        return Chunk("", ())
    logprobs = tuple(lp for c in chunks for lp in c.logprobs)
    return Chunk(
        "".join(c.text for c in chunks),
        tuple(t for c in chunks for t in c.token_ids),
        chunks[-1].finish_reason,
        chunks[-1].usage,
        logprobs,
        chunks[0].prompt_logprobs,
    )


async def collect(samples: AsyncIterator[Sample], n: int = 1) -> list[Chunk]:
    """Each of the ``n`` samples' whole answer (:func:`join`), by index."""
    parts: list[list[Chunk]] = [[] for _ in range(n)]
    async for index, chunk in samples:
        parts[index].append(chunk)
    return [join(p) for p in parts]


async def sse_events(
    first: Sample, rest: AsyncIterator[Sample], fmt: Formatter, n: int = 1
) -> AsyncIterator[bytes]:
    """Events for ``first`` then every chunk of ``rest`` (``n`` samples interleaved); a
    failure after the response started becomes an error event (OpenAI's error body), then
    ``[DONE]``. The usage, when asked for, counts every sample's output."""
    for event in fmt.start_events(n):
        yield event
    usages: list[Usage | None] = [None] * n
    seen: set[int] = set()
    try:
        item: Sample | None = first
        while item is not None:
            index, chunk = item
            for event in fmt.chunk_events(chunk, first=index not in seen, index=index):
                yield event
            seen.add(index)
            usages[index] = chunk.usage or usages[index]
            item = await anext(rest, None)
    except APIError as exc:
        yield sse(exc.body())
        yield DONE
        return
    for event in fmt.end_events(joined_usage(usages)):
        yield event
