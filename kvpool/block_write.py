"""Writing blocks to the pool one layer at a time (see :meth:`kvpool.pool.KVPool.begin_write`).

Owns :class:`PendingBlock` (one block to write), :class:`BlockWrite` (the write of several,
layer by layer, then their metas) and :class:`WriteTarget`, what a write needs of its pool:
the pool imports this module, never the other way round.

Commit rule: every layer object of a block is put first, each digested as it is put; the
meta object (digests and MAC: :mod:`kvpool.meta`) goes last, only for a block whose every
layer put succeeded.
"""

from __future__ import annotations

import time
from typing import Generic, NamedTuple, Protocol, TypeVar

from kvpool.evictor import ChainEvictor
from kvpool.layout import KVLayout
from kvpool.meta import MetaCodec
from kvpool.span_io import CacheSpan, SpanIO
from kvpool.stats import PoolStats
from kvpool.store import MooncakeStore


class WriteTarget(Protocol):
    """What a :class:`BlockWrite` uses of its pool (:class:`kvpool.pool.KVPool` is one): the
    layout, the span transfers, the meta codec, the store the metas go to, the eviction
    that settles claimed blocks (None: off) and the counters."""

    @property
    def layout(self) -> KVLayout: ...

    @property
    def io(self) -> SpanIO: ...

    @property
    def codec(self) -> MetaCodec: ...

    @property
    def store(self) -> MooncakeStore: ...

    @property
    def evictor(self) -> ChainEvictor | None: ...

    @property
    def stats(self) -> PoolStats: ...


PoolT = TypeVar("PoolT", bound=WriteTarget)
"""The pool a write goes to (its type kept, so a caller reads its own pool back)."""


class PendingBlock(NamedTuple):
    """One block to write: its ``meta_key``, the ``page`` holding its KV, and the ``extra``
    fields of its meta (a request-scoped partial block's ``tokens`` and ``expires``)."""

    meta_key: str
    page: int
    extra: dict[str, float]

    @property
    def expires(self) -> float:
        """The lease end (``time.time()``) of a partial block; ``KeyError`` for a full one."""
        return self.extra["expires"]


class BlockWrite(Generic[PoolT]):
    """Blocks being written to the pool, one layer at a time.

    Lifecycle: ``write_layer(i)`` for every layer (each puts that layer's span of every
    block and digests it) -> ``commit()`` (metas of the blocks whose layers all landed;
    returns how many). Layer writes may run on a helper thread while the model computes the
    next layer; ``commit`` must come after the last of them.
    """

    def __init__(
        self, pool: PoolT, blocks: list[PendingBlock], indexed: frozenset[str] = frozenset()
    ) -> None:
        self.pool = pool
        self.blocks = blocks
        self.indexed = indexed
        """Meta keys of the blocks claimed in the chain index (settled there by commit)."""
        self.ok = [True] * len(blocks)
        self.sums: list[list[bytes]] = [[b""] * pool.layout.num_layers for _ in blocks]
        self.seconds = 0.0
        self.bytes = 0

    def write_layer(self, layer: int, after: object | None = None) -> None:
        """Put layer ``layer`` of every block; ``after`` is the pool's
        :meth:`~kvpool.span_io.DirectIO.mark` taken when that layer was computed (the
        copies out of a GPU wait for it)."""
        if not self.blocks:
            return
        t0 = time.perf_counter()
        keys = [f"{block.meta_key}/{layer}" for block in self.blocks]
        spans = [CacheSpan(layer, block.page) for block in self.blocks]
        for i, digest in enumerate(self.pool.io.send(keys, spans, after)):
            if digest is None:
                self.ok[i] = False
            else:
                self.sums[i][layer] = digest
                self.bytes += self.pool.layout.span_bytes
        self.seconds += time.perf_counter() - t0

    def commit(self) -> int:
        t0 = time.perf_counter()
        pool = self.pool
        metas = [
            (block.meta_key, pool.codec.encode(block.meta_key, sums, block.extra))
            for block, ok, sums in zip(self.blocks, self.ok, self.sums, strict=True)
            if ok
        ]
        if metas and pool.store.put_bytes([k for k, _ in metas], [v for _, v in metas]) != 0:
            metas = []
        if pool.evictor is not None and self.indexed:
            landed = {k for k, _ in metas}
            claimed = [b.meta_key for b in self.blocks if b.meta_key in self.indexed]
            pool.evictor.settle(
                [k for k in claimed if k in landed], [k for k in claimed if k not in landed]
            )
        per = pool.layout.num_layers
        stats = pool.stats
        stats.blocks_written += len(metas)
        stats.objects_written += len(metas) * (per + 1)
        stats.bytes_written += len(metas) * per * pool.layout.span_bytes
        self.seconds += time.perf_counter() - t0
        stats.write_seconds += self.seconds
        return len(metas)

    def write_all(self) -> int:
        """Every layer, then :meth:`commit` (the write after compute, not overlapped)."""
        after = self.pool.io.mark()
        for layer in range(self.pool.layout.num_layers):
            self.write_layer(layer, after)
        return self.commit()
