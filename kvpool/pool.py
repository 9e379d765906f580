"""KV blocks between one worker's slab and the shared pool, keyed by prefix hash.

Key space: :mod:`kvpool.keys` (meta object ``<tag>/b/<hash>`` with one object per layer
below it; request-scoped partial blocks under ``<tag>/r/<request name>``, a keyed digest of
the request id). A meta object (:mod:`kvpool.meta`) holds the namespace text, wire layout,
writer, one digest per layer (SHA-256 or xxh3-64, by the namespace's algorithm) and a MAC
under the pool block key over all of it and the block's name; a partial block's meta also
holds its valid token count and its lease (``expires``): it lives there until the decode
side takes it, or until the writer's sweep after the lease (:mod:`kvpool.partial`).

Commit rule: a writer puts every layer object of a block first and the meta object last,
only when every layer put succeeded. Puts never overwrite, so the first writer's objects
stay. A block is *present* when its meta and all its layers exist: :meth:`KVPool.lookup`
checks exactly that for a whole chain in one batched existence call. Readers check the
meta's MAC before reading a block's layers, then every layer against the meta's digests; a
missing object, a layout or namespace mismatch, a bad MAC (counted as a forged block), a
short read or a digest mismatch makes that block and every later one a miss (counted), and a
block that fails the MAC or its digests is removed so the next writer can publish it again.
Nothing unverified is ever handed to the model.

Eviction (optional, :meth:`KVPool.evict_through`): full prefix blocks are claimed in the
shared chain index before they are written and refreshed there when read, and the writers
evict least recently used chain tails to keep the pool under a budget
(:mod:`kvpool.evictor`); request-scoped blocks stay out of it (their lease removes them).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from kvpool.block_write import BlockWrite, PendingBlock
from kvpool.chain_index import ChainIndex
from kvpool.evictor import ChainEvictor, chain_parents
from kvpool.hashing import Namespace
from kvpool.keys import KeySpace, completeness, longest_prefix
from kvpool.layout import KVLayout
from kvpool.meta import BlockMeta, MetaCodec, MetaFault, layer_digest
from kvpool.partial import PartialBlocks
from kvpool.span_io import CacheSpan, DirectIO, Received, SpanCopier, SpanIO, StagedIO
from kvpool.stats import Lease, PoolStats
from kvpool.store import MooncakeStore
from kvpool.tiers import receive_by_tier

__all__ = ["BlockMeta", "BlockWrite", "KVPool", "Lease", "PendingBlock", "PoolStats"]


class KVPool:
    """One worker's view of the pool over its KV slab.

    ``memory`` is the address of a host-memory slab (moved in place) or a
    :class:`kvpool.span_io.SpanCopier` (moved through its host staging slots, or in place
    from device memory): :attr:`io` does every transfer (:mod:`kvpool.span_io`).

    Lifecycle: construct (registers memory for zero-copy transfers) -> optionally
    :meth:`evict_through` (chain-aware eviction) -> ``lookup`` / ``save`` / ``load`` and the
    requests' partial last blocks (:attr:`partials`, whose ``sweep`` is called now and then
    to expire this writer's uncollected ones) -> :meth:`close` (unregisters, stops the
    eviction budget's reader). Not thread-safe: one engine thread owns it (a
    :class:`BlockWrite` commit may run on one helper thread).

    ``block_key`` is ``proto.trust.derive(cluster_secret, POOL_BLOCK)``: it MACs every meta
    written and checks every meta read, and names request-scoped keys. Empty (no secret):
    the same checks, which then protect against nothing but corruption.
    """

    def __init__(
        self,
        store: MooncakeStore,
        namespace: Namespace,
        layout: KVLayout,
        memory: int | SpanCopier,
        writer: str,
        request_ttl_s: float = 60.0,
        block_key: bytes = b"",
    ) -> None:
        self.store = store
        self.namespace = namespace
        self.layout = layout
        self.writer = writer
        self.keys = KeySpace.of(namespace, layout.num_layers, block_key)
        self.codec = MetaCodec(namespace, layout.wire, writer, layout.num_layers, block_key)
        self.digest = layer_digest(namespace.algorithm)
        """``digest(ptr, size)``: the layer digest of the namespace's algorithm."""
        self.stats = PoolStats()
        self.partials = PartialBlocks(self, layout.block_tokens, request_ttl_s)
        """Requests' partial last blocks, each kept ``request_ttl_s`` at most
        (:mod:`kvpool.partial`)."""
        self.slab_ptr = memory if isinstance(memory, int) else memory.cache_ptr
        """Where the KV slab starts (host or device memory)."""
        self.io: SpanIO = (
            DirectIO(store, layout, memory, self.digest)
            if isinstance(memory, int)
            else StagedIO(store, layout, memory, self.digest)
        )
        self.evictor: ChainEvictor | None = None
        """Chain-aware eviction, when :meth:`evict_through` turned it on."""

    def evict_through(self, index: ChainIndex, budget: Callable[[], int | None]) -> None:
        """Evict chain-aware through ``index`` within ``budget`` bytes (:mod:`kvpool.evictor`);
        ``budget`` is stopped by :meth:`close` when it is a :class:`~kvpool.budget.PoolBudget`."""
        self.evictor = ChainEvictor(index, self.store, self.keys, self.block_bytes, budget)

    @property
    def block_bytes(self) -> int:
        """What one full block takes in the pool: its layer objects and its meta object."""
        sums = [self.digest(0, 0)] * self.layout.num_layers
        meta = self.codec.encode(self.keys.meta_key(0), sums, {})
        return self.layout.num_layers * self.layout.span_bytes + len(meta)

    def admit(self, hashes: list[int], parents: list[int | None]) -> list[bool]:
        """Per block about to be written (a run in chain order, each extending its
        ``parents`` entry), whether it may be: all, without eviction; else what
        :meth:`kvpool.evictor.ChainEvictor.admit` says (after evicting for room)."""
        if self.evictor is None:
            return [True] * len(hashes)
        return self.evictor.admit(hashes, parents)

    @property
    def staged(self) -> bool:
        """Whether transfers go through host staging slots (:mod:`kvpool.span_io`; not in
        place, where the slots only carry the host copies digests are taken over)."""
        return isinstance(self.io, StagedIO) and not self.io.copier.in_place

    def _spans(self, page: int) -> list[CacheSpan]:
        return [CacheSpan(layer, page) for layer in range(self.layout.num_layers)]

    # -- lookup ----------------------------------------------------------------------------
    def lookup(self, hashes: list[int]) -> int:
        """How many leading blocks of the chain ``hashes`` are present (one batched call)."""
        t0 = time.perf_counter()
        n = longest_prefix(self.store, self.keys, hashes)
        self.stats.lookups += 1
        self.stats.lookup_seconds += time.perf_counter() - t0
        return n

    # -- write -----------------------------------------------------------------------------
    def absent(self, hashes: list[int]) -> list[bool]:
        """Per block, whether it must be written: missing, or only partly present (then its
        leftovers, e.g. a layer evicted, are removed here so it can be written anew)."""
        out: list[bool] = []
        if not hashes:
            return out
        for h, complete in zip(hashes, completeness(self.store, self.keys, hashes), strict=True):
            if complete is None:
                self.heal(self.keys.meta_key(h))
            out.append(not complete)
        return out

    def begin_write(
        self, blocks: list[PendingBlock], indexed: frozenset[str] = frozenset()
    ) -> BlockWrite[KVPool]:
        """Start writing blocks given as ``(meta key, page, extra meta fields)``; those
        whose meta keys are in ``indexed`` were admitted (:meth:`admit`) and are settled in
        the chain index by the commit.

        The caller writes every layer (:meth:`BlockWrite.write_layer`, in any order, from one
        thread at a time, e.g. each layer as soon as the model computed it) and then calls
        :meth:`BlockWrite.commit`, which publishes the metas of the blocks whose every layer
        landed.
        """
        return BlockWrite(self, blocks, indexed)

    def save(self, hashes: list[int], pages: list[int], first_parent: int | None = None) -> int:
        """Publish full blocks (``hashes[i]`` computed in ``pages[i]``, a run of a chain
        whose first block extends ``first_parent``) that the pool lacks.

        Returns how many blocks this call committed. A block whose layer puts fail (e.g. the
        pool is full) is not committed, nor is one eviction refused.
        """
        admitted = self.admit(hashes, chain_parents(hashes, first_parent))
        todo = [
            PendingBlock(self.keys.meta_key(h), page, {})
            for h, page, missing, ok in zip(
                hashes, pages, self.absent(hashes), admitted, strict=True
            )
            if missing and ok
        ]
        return self.begin_write(todo, frozenset(b.meta_key for b in todo)).write_all()

    # -- read ------------------------------------------------------------------------------
    def parse_meta(self, raw: bytes, meta_key: str) -> BlockMeta | MetaFault:
        """The meta object ``raw`` of the block named ``meta_key``, checked (format,
        namespace, layout, then MAC: :meth:`kvpool.meta.MetaCodec.decode`), or its fault,
        counted (``bad_meta`` / ``forged_blocks``). A forged block is removed here (every
        reader of it would refuse it), so the next writer can publish the real one. A MAC
        that fails on bytes the block no longer holds when read again was a read racing an
        eviction (the memory reused under it): refused too, but counted as a short read."""
        meta = self.codec.decode(raw, meta_key)
        if meta is MetaFault.BAD:
            self.stats.bad_meta += 1
        elif meta is MetaFault.FORGED and self.store.get_bytes([meta_key])[0] != raw:
            self.stats.short_reads += 1
        elif meta is MetaFault.FORGED:
            self.stats.forged_blocks += 1
            self.heal(meta_key)
        return meta

    def load(self, hashes: list[int], pages: list[int], prefix: Sequence[int] = ()) -> int:
        """Read the leading present blocks of ``hashes`` into ``pages``; verify every layer.
        ``prefix`` is the chain before ``hashes`` (from its first block; held elsewhere,
        e.g. in the engine's own cache).

        Returns how many leading blocks were loaded and verified. Pages past that count may
        hold partial data and must be treated as not computed. The loaded blocks and their
        ``prefix`` become the most recently used (a hit refreshes the whole chain it used).
        """
        t0 = time.perf_counter()
        loaded = self.read_blocks([self.keys.meta_key(h) for h in hashes], pages)
        if self.evictor is not None and loaded:
            used = [*prefix, *hashes[:loaded]]
            self.evictor.touch(used, chain_parents(used, None))
        self.stats.hit_blocks += loaded
        self.stats.miss_blocks += len(hashes) - loaded
        self.stats.hit_tokens += loaded * self.layout.block_tokens
        self.stats.miss_tokens += (len(hashes) - loaded) * self.layout.block_tokens
        self.stats.read_seconds += time.perf_counter() - t0
        return loaded

    def leading_metas(self, meta_keys: list[str]) -> list[BlockMeta]:
        """The parsed metas of ``meta_keys`` up to the first missing or unfit one."""
        metas: list[BlockMeta] = []
        for key, raw in zip(meta_keys, self.store.get_bytes(meta_keys), strict=True):
            meta = self.parse_meta(raw, key) if raw else None
            if not isinstance(meta, BlockMeta):
                break
            metas.append(meta)
        return metas

    def read_blocks(
        self, meta_keys: list[str], pages: list[int], metas: list[BlockMeta] | None = None
    ) -> int:
        """Layers of the blocks named by ``meta_keys`` into ``pages``; leading verified count.

        ``metas`` are fetched here unless the caller already has them.
        """
        metas = self.leading_metas(meta_keys) if metas is None else metas
        per = self.layout.num_layers
        keys = [k for meta_key in meta_keys[: len(metas)] for k in self.keys.layer_keys(meta_key)]
        spans = [span for page in pages[: len(metas)] for span in self._spans(page)]
        got = self._receive(keys, spans)
        self.stats.objects_read += len(keys)
        self.stats.bytes_read += sum(g.nbytes for g in got if g.nbytes > 0)
        for i, meta in enumerate(metas):
            if not self.verify_block(got[i * per : (i + 1) * per], meta.sums):
                self.heal(meta_keys[i])
                return i
        return len(metas)

    def _receive(self, keys: list[str], spans: list[CacheSpan]) -> list[Received]:
        """``io.receive``; with an SSD tier, in a batch per tier (:mod:`kvpool.tiers`)."""
        if not self.store.ssd:
            return self.io.receive(keys, spans)
        tiers = self.store.tiers(keys)
        size = self.layout.span_bytes
        return receive_by_tier(self.io.receive, tiers, keys, spans, size, self.stats)

    def verify_block(self, got: list[Received], sums: list[bytes]) -> bool:
        """Whether every layer of a block was read in full and matches its digest in
        ``sums`` (counted otherwise)."""
        size = self.layout.span_bytes
        if any(g.nbytes != size for g in got):
            self.stats.short_reads += 1
            return False
        if [g.digest for g in got] != sums:
            self.stats.checksum_failures += 1
            return False
        return True

    def heal(self, meta_key: str) -> None:
        """Remove a block that failed verification so a writer can publish it again."""
        self.store.remove([meta_key, *self.keys.layer_keys(meta_key)])
        self.stats.healed_blocks += 1
        if self.evictor is not None:
            self.evictor.forget(meta_key)

    def close(self) -> None:
        self.io.close()
        if self.evictor is not None:
            self.evictor.close()
