"""Requests waiting for KV memory on the decode workers: one FIFO queue per router. Pure
asyncio; the caller's ``attempt`` does the I/O.

A disaggregated request needs a decode reservation before its prefill. When every decode
candidate answers "no free pages now", the request waits here, within its deadline, instead
of being refused. Contract of :class:`KVWaitQueue`:

1. :meth:`KVWaitQueue.admit` makes the caller's ``attempt`` at once when nobody waits (the
   usual case: no queue, no delay). An attempt returns its result (through), or None (not
   now); it raises to give up (the request can never fit, or no worker is left to ask);
2. otherwise, or when that first attempt answered None, the request joins the tail. Only
   the head attempts, and only when woken: by :meth:`wake` (fresh load reports came, or a
   request of this router ended and gave its pages back) or, should no signal come, every
   ``retry_s``. A wait thus costs the workers a few ``Reserve`` calls a second at most,
   however many requests wait, and none while the waiters hold nothing;
3. the head that got through wakes the next one, which attempts at once (pages may be
   left): the queue drains in arrival order, so a big request at its head is never passed
   by the small ones behind it (as a worker's scheduler admits its own queue);
4. a waiter leaves the queue however its wait ends: through, past its deadline
   (``TimeoutError``), or cancelled (the client went away); if it was the head, the next
   one is woken. Nothing of it stays behind.

Waiters hold no page anywhere, so a wait can never block a request that holds pages: no
deadlock. Requests that need no reservation (the decode worker prefills them itself) pass
through :meth:`admit` as well, with an attempt that always gets through: when others wait,
they take their turn behind them rather than the pages those wait for.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

RETRY_S = 2.0
"""Longest time between two attempts of the head when no signal comes (a safety net: the
router's registry polls wake it more often)."""


def _ignore(_: float) -> None:
    return None


class KVWaitQueue:
    """Lifecycle: one per router; flows call :meth:`admit`; :meth:`wake` on every sign that
    pages came free. ``on_count(n)``: the number of waiters changed (a gauge);
    ``on_waited(s)``: a waiter left after ``s`` seconds in the queue (a histogram)."""

    def __init__(
        self,
        on_count: Callable[[float], None] = _ignore,
        on_waited: Callable[[float], None] = _ignore,
        retry_s: float = RETRY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if retry_s <= 0:
            raise ValueError("retry_s must be positive (seconds)")
        self._waiters: deque[asyncio.Event] = deque()
        self._wakes = 0
        """How many times :meth:`wake` was called (a wake during a first attempt is kept)."""
        self._on_count = on_count
        self._on_waited = on_waited
        self._retry_s = retry_s
        self._clock = clock

    def __len__(self) -> int:
        return len(self._waiters)

    def wake(self) -> None:
        """Pages may have come free: the head attempts again (now, or as soon as the
        attempt it is making ends)."""
        self._wakes += 1
        if self._waiters:
            self._waiters[0].set()

    async def admit(
        self, attempt: Callable[[], Awaitable[T | None]], seconds_left: Callable[[], float]
    ) -> T:
        """The first non-None result of ``attempt``, made in queue order (module docstring).
        ``seconds_left()``: the request's time left; ``TimeoutError`` once it is spent
        while waiting. Whatever ``attempt`` raises ends the wait and is raised."""
        turn = asyncio.Event()
        if not self._waiters:
            wakes = self._wakes
            got = await attempt()
            if got is not None:
                return got
            if self._wakes != wakes:  # pages came free meanwhile: try again at once
                turn.set()
        return await self._wait(turn, attempt, seconds_left)

    async def _wait(
        self,
        turn: asyncio.Event,
        attempt: Callable[[], Awaitable[T | None]],
        seconds_left: Callable[[], float],
    ) -> T:
        self._waiters.append(turn)
        self._on_count(len(self._waiters))
        since = self._clock()
        try:
            while True:
                await self._woken(turn, seconds_left())
                if turn is self._waiters[0]:
                    got = await attempt()
                    if got is not None:
                        return got
        finally:
            self._leave(turn)
            self._on_waited(self._clock() - since)

    async def _woken(self, turn: asyncio.Event, left: float) -> None:
        """Wait for ``turn`` (a wake, or the head's leaving) or ``retry_s``, whichever comes
        first; ``TimeoutError`` when no time is ``left``."""
        if left <= 0:
            raise TimeoutError
        try:
            await asyncio.wait_for(turn.wait(), min(left, self._retry_s))
        except TimeoutError:
            if left <= self._retry_s:
                raise
        turn.clear()

    def _leave(self, turn: asyncio.Event) -> None:
        was_head = self._waiters[0] is turn
        self._waiters.remove(turn)
        if was_head and self._waiters:
            self._waiters[0].set()
        self._on_count(len(self._waiters))
