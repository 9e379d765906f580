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
from collections.abc import AsyncIterator, Awaitable
from typing import Any, TypeVar

from starlette.requests import Request

from router.errors import APIError
from router.flow_types import Chunk
from router.responses import DONE, Formatter, sse

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


async def collect(chunks: AsyncIterator[Chunk]) -> Chunk:
    """The whole answer as one chunk: every chunk's text and token ids joined, in order,
    with the last chunk's finish reason and usage."""
    texts: list[str] = []
    ids: list[int] = []
    last = Chunk("", ())
    async for last in chunks:
        texts.append(last.text)
        ids.extend(last.token_ids)
    return Chunk("".join(texts), tuple(ids), last.finish_reason, last.usage)


async def sse_events(
    first: Chunk, rest: AsyncIterator[Chunk], fmt: Formatter
) -> AsyncIterator[bytes]:
    """Events for ``first`` then every chunk of ``rest``; a failure after the response
    started becomes an error event (OpenAI's error body), then ``[DONE]``."""
    for event in fmt.start_events():
        yield event
    chunk = first
    try:
        for event in fmt.chunk_events(first, first=True):
            yield event
        async for chunk in rest:
            for event in fmt.chunk_events(chunk):
                yield event
    except APIError as exc:
        yield sse(exc.body())
        yield DONE
        return
    for event in fmt.end_events(chunk.usage):
        yield event
