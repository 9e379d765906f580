"""Prefix-cache models shared by the simulator and the trace replay (``kvserve bench
trace``): :func:`leading` counts a chain's leading present hashes, :class:`LRUCache` is an
exact LRU set of block hashes. Pure."""

from __future__ import annotations

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
