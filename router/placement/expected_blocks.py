"""Blocks a router's own placements will put in workers' caches, before their events say so.

Pure. A worker's KV events name a prompt's blocks only once its prefill computed them, so
for the seconds between a placement and those events the index
(:mod:`router.placement.prefix_index`) does not know that the worker is about to hold the prompt,
and a second request with the same prefix, placed meanwhile, sees no overlap anywhere (with small
caches most re-use happens within those seconds). :class:`ExpectedBlocks` closes that gap, as
Dynamo's router does with the requests it routed:

1. :meth:`ExpectedBlocks.placed` notes, when a request is placed, that each worker it goes
   to will hold the blocks of its prompt chain, until ``now + ttl_s``;
2. :meth:`ExpectedBlocks.observe` takes every event batch the index applied: a ``Stored``
   name is now the index's to report, a ``Removed`` one is gone; either way the
   expectation on that worker ends;
3. :meth:`ExpectedBlocks.extend` continues each worker's index match along the chain while
   the worker is expected to hold the next block (an expired expectation counts as none);
4. :meth:`ExpectedBlocks.forget` drops a worker that left; expired expectations are
   dropped as time passes (every call), so memory is bounded by the placements of the last
   ``ttl_s``.

An expectation is a hint like the index itself: a request that went elsewhere or failed
leaves one until it expires, which costs at most a worse placement.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Mapping, Sequence

from proto.kv_events import EventBatch

TTL_S = 30.0
"""How long a placement's expectation lasts without events confirming or denying it:
longer than a prompt waits and prefills on a loaded worker."""


class ExpectedBlocks:
    """Per worker, the block names it is expected to hold and until when (module
    docstring). Times are the caller's clock, in seconds, never decreasing."""

    def __init__(self, ttl_s: float = TTL_S) -> None:
        if not ttl_s > 0:
            raise ValueError(f"ttl_s must be positive, got {ttl_s}")
        self.ttl_s = ttl_s
        self._until: dict[str, dict[int, float]] = {}
        self._placed: list[tuple[float, int, str, tuple[int, ...]]] = []
        """A heap of (until, order, worker id, names): each placement's end."""
        self._order = itertools.count()

    def placed(
        self,
        worker_ids: Sequence[str],
        chain: Sequence[int],
        now: float,
        until: float | None = None,
    ) -> None:
        """Expect each of ``worker_ids`` to hold the blocks named ``chain`` (a prompt's
        chain, root first) until ``until`` (default ``now + ttl_s``; a caller that knows
        when the worker's events for it arrive may end it then)."""
        self._expire(now)
        until = now + self.ttl_s if until is None else min(until, now + self.ttl_s)
        if not chain or until <= now:
            return
        names = tuple(chain)
        for worker_id in dict.fromkeys(worker_ids):
            held = self._until.setdefault(worker_id, {})
            for name in names:
                held[name] = max(until, held.get(name, until))
            heapq.heappush(self._placed, (until, next(self._order), worker_id, names))

    def observe(self, batch: EventBatch) -> None:
        """End the expectations that ``batch`` (applied to the index) confirms or denies."""
        held = self._until.get(batch.worker_id)
        if held is None:
            return
        for event in batch.events:
            held.pop(event.hash, None)

    def extend(
        self, matched: Mapping[str, int], chain: Sequence[int], now: float
    ) -> dict[str, int]:
        """``matched`` (leading blocks of ``chain`` per worker, from the index) with each
        worker's match continued while it is expected to hold the next block; workers
        the index did not answer for start at 0 and are left out when nothing is
        expected of them."""
        self._expire(now)
        out = dict(matched)
        for worker_id, held in self._until.items():
            start = out.get(worker_id, 0)
            end = start
            while end < len(chain) and held.get(chain[end], now) > now:
                end += 1
            if end > start or worker_id in out:
                out[worker_id] = end
        return out

    def forget(self, worker_id: str) -> None:
        """Drop every expectation of ``worker_id`` (it left the cluster)."""
        self._until.pop(worker_id, None)

    def _expire(self, now: float) -> None:
        while self._placed and self._placed[0][0] <= now:
            _, _, worker_id, names = heapq.heappop(self._placed)
            held = self._until.get(worker_id)
            if held is None:
                continue
            for name in names:
                if held.get(name, now + 1) <= now:
                    del held[name]
            if not held:
                del self._until[worker_id]
