"""A request's partial last block in the pool: the tokens of a prompt past its last full
block, handed from the prefill side to the decode side once, under a lease.

Key space: ``<tag>/r/<request name>`` (:meth:`kvpool.keys.KeySpace.request_key`: a keyed
digest of the request id), written and read with the same commit rule and checks as full
blocks; its meta also holds its valid token count and its lease end (``expires``).

Lifecycle of one partial block:

1. the prefill side writes it, alone (:meth:`PartialBlocks.put`) or as one more block of a
   step's write (:meth:`PartialBlocks.pending`, then :meth:`PartialBlocks.lease` once the
   write committed it);
2. the decode side takes it once (:meth:`PartialBlocks.take`: read into a page, then
   deleted), or drops it (:meth:`PartialBlocks.drop`) when it no longer needs it;
3. the writer's :meth:`PartialBlocks.sweep`, called now and then, removes the ones its
   leases say nobody took in time (counted in ``expired_requests``).

Not thread-safe: the pool's owner thread calls it (:class:`kvpool.pool.KVPool`).
"""

from __future__ import annotations

import time
from typing import Any, Protocol

from kvpool.block_write import BlockWrite, PendingBlock
from kvpool.keys import KeySpace
from kvpool.meta import BlockMeta
from kvpool.stats import Leases, PoolStats
from kvpool.store import MooncakeStore


class PartialTarget(Protocol):
    """What partial blocks use of their pool (:class:`kvpool.pool.KVPool` is one): its key
    space, store and counters, its block writes, and its checked reads."""

    @property
    def keys(self) -> KeySpace: ...

    @property
    def store(self) -> MooncakeStore: ...

    @property
    def stats(self) -> PoolStats: ...

    def begin_write(
        self, blocks: list[PendingBlock], indexed: frozenset[str] = frozenset()
    ) -> BlockWrite[Any]: ...

    def leading_metas(self, meta_keys: list[str]) -> list[BlockMeta]: ...

    def read_blocks(
        self, meta_keys: list[str], pages: list[int], metas: list[BlockMeta] | None = None
    ) -> int: ...


class PartialBlocks:
    """The partial blocks this pool member writes and takes (module docstring), each kept
    ``ttl_s`` seconds at most; ``block_tokens`` bounds a block's valid tokens."""

    def __init__(self, pool: PartialTarget, block_tokens: int, ttl_s: float) -> None:
        self.pool = pool
        self.block_tokens = block_tokens
        self.ttl_s = ttl_s
        self._leases = Leases()

    def pending(self, request_id: str, page: int, num_tokens: int) -> PendingBlock:
        """A request's partial last block (``num_tokens`` valid, in ``page``), for the
        pool's ``begin_write``; its meta carries the token count and a lease: call
        :meth:`lease` once it is committed."""
        assert 0 < num_tokens <= self.block_tokens
        extra = {"tokens": num_tokens, "expires": time.time() + self.ttl_s}
        return PendingBlock(self.pool.keys.request_key(request_id), page, extra)

    def lease(self, request_id: str, expires: float) -> None:
        """Have :meth:`sweep` remove ``request_id``'s partial block after ``expires``."""
        self._leases.add(request_id, expires)

    def put(self, request_id: str, page: int, num_tokens: int) -> bool:
        """Write a request's partial last block (``num_tokens`` valid) under a lease;
        whether it was committed."""
        block = self.pending(request_id, page, num_tokens)
        ok = self.pool.begin_write([block]).write_all() == 1
        if ok:
            self.lease(request_id, block.expires)
        return ok

    def take(self, request_id: str, page: int) -> int | None:
        """Read a request's partial block into ``page`` and delete it from the pool: its
        number of valid tokens, or ``None`` if it is absent, expired or fails verification
        (the caller then recomputes those tokens)."""
        key = self.pool.keys.request_key(request_id)
        live = (m for m in self.pool.leading_metas([key]) if m.expires > time.time())
        meta = next(live, None)
        ok = meta is not None and self.pool.read_blocks([key], [page], [meta]) == 1
        self.drop(request_id)
        return meta.tokens if ok and meta is not None else None

    def drop(self, request_id: str) -> bool:
        """Delete a request's partial block; False if it was not there."""
        key = self.pool.keys.request_key(request_id)
        return self.pool.store.remove([key, *self.pool.keys.layer_keys(key)])[0] == 0

    def sweep(self, now: float | None = None) -> int:
        """Remove this writer's partial blocks whose lease ran out; how many were there."""
        now = time.time() if now is None else now
        expired = 0
        while (request_id := self._leases.pop_expired(now)) is not None:
            expired += self.drop(request_id)
        self.pool.stats.expired_requests += expired
        return expired
