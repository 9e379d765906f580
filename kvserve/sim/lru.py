"""Prefix-cache models shared by the simulator and the trace replay (``kvserve bench
trace``): :func:`leading` counts a chain's leading present hashes, :class:`LRUCache` is an
exact LRU set of block hashes, :class:`LeafFirstLRU` the same evicting only chain tails
(what the pool's chain-aware eviction does: :mod:`kvpool.chain_index`). Pure."""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence


def leading(chain: Sequence[int], present: Callable[[int], bool]) -> int:
    """How many leading hashes of ``chain`` satisfy ``present``."""
    return next((i for i, h in enumerate(chain) if not present(h)), len(chain))


class LRUCache:
    """An exact LRU set of block hashes holding at most ``capacity`` of them."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be positive, got {capacity}")
        self.capacity = capacity
        self.evictions = 0
        self._order: OrderedDict[int, None] = OrderedDict()

    def __contains__(self, block_hash: int) -> bool:
        return block_hash in self._order

    def __len__(self) -> int:
        return len(self._order)

    def touch(self, chain: Iterable[int]) -> None:
        """Insert or refresh each hash in order (the last is the most recent), evicting the
        least recently used beyond capacity."""
        for h in chain:
            if h in self._order:
                self._order.move_to_end(h)
            else:
                self._order[h] = None
                if len(self._order) > self.capacity:
                    self._order.popitem(last=False)
                    self.evictions += 1


class LeafFirstLRU:
    """A set of at most ``capacity`` block hashes that evicts the least recently used
    *leaf*: a block no cached block extends. So a cached block's whole prefix is cached.

    :meth:`touch` takes whole chains from their first block; each block gets its own tick,
    in chain order (a chain's tail is its newest block), as in the pool's index.
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be positive, got {capacity}")
        self.capacity = capacity
        self.evictions = 0
        self._tick: dict[int, int] = {}
        self._parent: dict[int, int | None] = {}
        self._kids: dict[int, int] = {}
        self._leaves: list[tuple[int, int]] = []  # (tick, hash) heap, stale entries skipped
        self._clock = 0

    def __contains__(self, block_hash: int) -> bool:
        return block_hash in self._tick

    def __len__(self) -> int:
        return len(self._tick)

    def touch(self, chain: Sequence[int]) -> None:
        """Insert or refresh a chain (from its first block), evicting leaves beyond capacity
        (never a block of this chain)."""
        parent: int | None = None
        for h in chain:
            self._clock += 1
            if h not in self._tick:
                while len(self._tick) >= self.capacity and self._evict():
                    pass
                self._parent[h] = parent
                self._kids[h] = 0
                if parent is not None:
                    self._kids[parent] += 1
            self._tick[h] = self._clock
            parent = h
        for h in chain:
            if self._kids.get(h) == 0:
                heapq.heappush(self._leaves, (self._tick[h], h))

    def _evict(self) -> bool:
        """Evict the least recently used leaf; False when none is older than this touch."""
        while self._leaves:
            tick, h = self._leaves[0]
            if self._tick.get(h) == tick and self._kids[h] == 0:
                break
            heapq.heappop(self._leaves)
        else:
            return False
        heapq.heappop(self._leaves)
        del self._tick[h], self._kids[h]
        parent = self._parent.pop(h)
        if parent is not None:
            self._kids[parent] -= 1
            if self._kids[parent] == 0:
                heapq.heappush(self._leaves, (self._tick[parent], parent))
        self.evictions += 1
        return True
