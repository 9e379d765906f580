"""A request's ``n`` samples: ``n`` flows of one prompt, the prompt computed once.

:func:`start_samples` places sample 0 (:meth:`RouterService.run`; a 503 or 429 is raised
there, before anything is sent) and returns the samples' chunks as ``(index, chunk)``
pairs. Samples 1..n-1 (:meth:`AdmittedRequest.sample`: own request ids, seeds + index)
are placed only once sample 0's first chunk came, i.e. once its prompt was computed and
cached (on its worker, and in the pool where there is one), so their prompts are prefix
hits, not prefills; ``cache_aware``, which expects sample 0's blocks on its worker
(:mod:`router.placement.expected_blocks`), sends them there. From then on the samples' chunks come
as they are made, each sample's in order.

If one sample fails, the others are cancelled (each flow then aborts its request on every
worker) and the failure is raised; closing the iterator (a client gone) cancels them all.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Protocol

from router.flow.admitted import AdmittedRequest
from router.flow.types import Chunk

Sample = tuple[int, Chunk]
_END = object()


class Runner(Protocol):
    async def run(self, admitted: AdmittedRequest) -> AsyncIterator[Chunk]: ...


async def start_samples(service: Runner, admitted: AdmittedRequest) -> AsyncGenerator[Sample, None]:
    """Place sample 0 and return every sample's chunks (module docstring)."""
    first = await service.run(admitted.sample(0))
    return _samples(service, admitted, first)


async def _samples(
    service: Runner, admitted: AdmittedRequest, first: AsyncIterator[Chunk]
) -> AsyncGenerator[Sample, None]:
    try:
        chunk = await anext(first)
    except BaseException:
        await _close(first)
        raise
    yield 0, chunk
    if admitted.n == 1:
        async for chunk in first:
            yield 0, chunk
        return
    streams: list[AsyncIterator[Chunk]] = [first]
    try:
        for index in range(1, admitted.n):
            streams.append(await service.run(admitted.sample(index)))
    except BaseException:
        for stream in streams:
            await _close(stream)
        raise
    async for item in _merge(streams):
        yield item


async def _merge(streams: list[AsyncIterator[Chunk]]) -> AsyncIterator[Sample]:
    """The chunks of ``streams`` as they come, tagged with their stream's index."""
    queue: asyncio.Queue[tuple[int, object]] = asyncio.Queue()

    async def pump(index: int, stream: AsyncIterator[Chunk]) -> None:
        try:
            async for chunk in stream:
                await queue.put((index, chunk))
            await queue.put((index, _END))
        except Exception as exc:  # the consumer raises it
            await queue.put((index, exc))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    running = len(tasks)
    try:
        while running:
            index, item = await queue.get()
            if item is _END:
                running -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                assert isinstance(item, Chunk)
                yield index, item
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for stream in streams:
            await _close(stream)


async def _close(stream: AsyncIterator[Chunk]) -> None:
    aclose = getattr(stream, "aclose", None)
    if aclose is not None:
        with contextlib.suppress(Exception):
            await aclose()
