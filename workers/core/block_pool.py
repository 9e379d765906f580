"""A fixed set of KV pages with refcounts, an LRU free list and a prefix-cache index.

Pure bookkeeping (no torch). A page is *free* when no sequence holds it (refcount 0); a free
page may still carry the hash of the full block it holds, so a later request with the same
prefix can take it back (:meth:`BlockPool.lookup` + :meth:`BlockPool.touch`) instead of
recomputing. :meth:`BlockPool.allocate` takes the least recently freed page and forgets its
hash (eviction). Invariant: ``num_free + num_used == num_blocks``.

Once :meth:`BlockPool.log_events` was called, the pool also logs every change of its
prefix-cache index as a KV event (:mod:`proto.kv_events`): :class:`Stored` when
:meth:`BlockPool.cache` names a page, :class:`Removed` when a name is forgotten (eviction
by :meth:`BlockPool.allocate`, or :meth:`BlockPool.reset_prefix_cache`), in order. The
owner drains them with :meth:`BlockPool.take_events` (once per engine step) and publishes
them; replaying the names cached when logging began, then every event drained since, gives
:meth:`BlockPool.cached_names`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from proto.kv_events import KVEvent, Removed, Stored


class BlockPool:
    """Pages ``0 .. num_blocks - 1``; all free at start, in id order; KV events logged
    once :meth:`log_events` was called (module docstring)."""

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be positive, got {num_blocks}")
        self.num_blocks = num_blocks
        self.ref_counts = [0] * num_blocks
        self.block_hash: list[int | None] = [None] * num_blocks
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._by_hash: dict[int, int] = {}
        self._events: list[KVEvent] | None = None

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    def free_order(self) -> list[int]:
        """Free pages, next to be allocated first (for tests and debugging)."""
        return list(self._free)

    def can_allocate(self, n: int) -> bool:
        return n <= len(self._free)

    def allocate(self, n: int) -> list[int]:
        """Take ``n`` least recently freed pages (refcount 1 each), evicting their hashes."""
        if n > len(self._free):
            raise RuntimeError(f"asked for {n} pages with {len(self._free)} free")
        out = []
        for _ in range(n):
            block, _ = self._free.popitem(last=False)
            self._forget_hash(block)
            self.ref_counts[block] = 1
            out.append(block)
        return out

    def lookup(self, block_hash: int) -> int | None:
        """The page that holds the full block named ``block_hash``, if still cached."""
        return self._by_hash.get(block_hash)

    def touch(self, blocks: Iterable[int]) -> None:
        """Take one more reference on cached pages (reviving free ones)."""
        for block in blocks:
            if self.ref_counts[block] == 0:
                del self._free[block]
            self.ref_counts[block] += 1

    def free(self, blocks: Iterable[int]) -> None:
        """Drop one reference each; pages reaching zero join the free list's tail in order."""
        for block in blocks:
            assert self.ref_counts[block] > 0, f"double free of page {block}"
            self.ref_counts[block] -= 1
            if self.ref_counts[block] == 0:
                self._free[block] = None

    def free_chain(self, blocks: list[int]) -> None:
        """Drop one reference on each page of one sequence's chain, the last first, so
        its pages join the free list tail-first: under eviction a chain's leaves go
        before its root, and a prefix is never evicted while a block extending it stays
        cached (an extension without its prefix is unreachable)."""
        self.free(reversed(blocks))

    def cache(self, block: int, block_hash: int, parent: int = 0) -> None:
        """Record that ``block`` holds the full block ``block_hash``, whose parent in the
        prefix chain is ``parent`` (carried in the event only; 0 where the caller has no
        chain). First writer wins: a name already held, or a page already named, changes
        nothing and logs nothing."""
        assert self.ref_counts[block] > 0, f"caching unowned page {block}"
        if block_hash in self._by_hash or self.block_hash[block] is not None:
            return
        self.block_hash[block] = block_hash
        self._by_hash[block_hash] = block
        if self._events is not None:
            self._events.append(Stored(block_hash, parent))

    def _forget_hash(self, block: int) -> None:
        h = self.block_hash[block]
        if h is not None:
            self.block_hash[block] = None
            if self._by_hash.get(h) == block:
                del self._by_hash[h]
                if self._events is not None:
                    self._events.append(Removed(h))

    def reset_prefix_cache(self) -> None:
        """Forget every cached hash (pages keep their owners)."""
        if self._events is not None:
            self._events.extend(Removed(h) for h in self._by_hash)
        self._by_hash.clear()
        self.block_hash = [None] * self.num_blocks

    def log_events(self) -> None:
        """Log KV events from now on (the names cached before are in
        :meth:`cached_names`). The owner must drain them (:meth:`take_events`): they are
        kept until then."""
        if self._events is None:
            self._events = []

    def take_events(self) -> list[KVEvent]:
        """The events logged since the last call, oldest first (none before
        :meth:`log_events`)."""
        if not self._events:
            return []
        events, self._events = self._events, []
        return events

    def cached_names(self) -> list[int]:
        """Every block name the prefix cache holds now (a snapshot's contents)."""
        return list(self._by_hash)
