"""The discrete-event core: a clock and a queue of callbacks ordered by time.

Lifecycle: ``EventLoop()`` -> :meth:`EventLoop.at` / :meth:`EventLoop.after` schedule
callbacks (ties run in the order they were scheduled, so a run is deterministic) ->
:meth:`EventLoop.run` pops them in time order, advancing :attr:`EventLoop.now`, until none
is left or ``until`` is passed. Callbacks may schedule further callbacks.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable


class EventLoop:
    def __init__(self) -> None:
        self.now = 0.0
        self._queue: list[tuple[float, int, Callable[[], None]]] = []
        self._order = itertools.count()

    def at(self, when: float, fn: Callable[[], None]) -> None:
        """Run ``fn`` at time ``when`` (not before now)."""
        if when < self.now:
            raise ValueError(f"cannot schedule in the past ({when} < {self.now})")
        heapq.heappush(self._queue, (when, next(self._order), fn))

    def after(self, delay_s: float, fn: Callable[[], None]) -> None:
        self.at(self.now + max(0.0, delay_s), fn)

    def __len__(self) -> int:
        return len(self._queue)

    def run(self, until: float | None = None) -> None:
        """Run callbacks in time order until the queue is empty (or the next is past
        ``until``)."""
        while self._queue and (until is None or self._queue[0][0] <= until):
            when, _, fn = heapq.heappop(self._queue)
            self.now = when
            fn()
