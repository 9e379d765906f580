"""KV blocks between one worker's slab and the shared pool, keyed by prefix hash.

Key space: :mod:`kvpool.keys` (meta object ``<tag>/b/<hash>`` with one object per layer
below it; request-scoped partial blocks under ``<tag>/r/<request id>``). A meta object
holds the namespace text, wire layout, writer and one xxh3-64 checksum per layer; a
partial block's meta also holds its valid token count and its lease (``expires``): it lives
there until the decode side takes it, or until the writer's sweep after the lease.

Commit rule: a writer puts every layer object of a block first and the meta object last,
only when every layer put succeeded. Puts never overwrite, so the first writer's objects
stay. A block is *present* when its meta and all its layers exist: :meth:`KVPool.lookup`
checks exactly that for a whole chain in one batched existence call. Readers verify every
layer against the meta checksums; a missing object, a layout or namespace mismatch, a short
read or a checksum mismatch makes that block and every later one a miss (counted), and a
block that fails verification is removed so the next writer can publish it again. Nothing
unverified is ever handed to the model.
"""

from __future__ import annotations

import ctypes
import heapq
import json
import time
from dataclasses import dataclass

import xxhash

from kvpool.hashing import Namespace
from kvpool.keys import KeySpace, completeness, longest_prefix
from kvpool.layout import KVLayout
from kvpool.store import MooncakeStore

META_VERSION = 1


@dataclass
class PoolStats:
    """Counters since start (read by metrics exporters and benchmarks)."""

    blocks_written: int = 0
    """Blocks committed (full prefix blocks and request-scoped partial blocks)."""
    objects_written: int = 0
    bytes_written: int = 0
    objects_read: int = 0
    bytes_read: int = 0
    lookups: int = 0
    hit_blocks: int = 0
    miss_blocks: int = 0
    hit_tokens: int = 0
    miss_tokens: int = 0
    checksum_failures: int = 0
    short_reads: int = 0
    bad_meta: int = 0
    healed_blocks: int = 0
    expired_requests: int = 0
    write_seconds: float = 0.0
    """Time spent in layer puts and meta commits (wherever they overlapped compute)."""
    read_seconds: float = 0.0
    lookup_seconds: float = 0.0


PendingBlock = tuple[str, int, dict[str, float]]
"""``(meta key, page, extra meta fields)`` of one block to write."""


@dataclass(frozen=True)
class BlockMeta:
    """What a reader needs from a meta object that fits its namespace and layout."""

    sums: list[int]
    tokens: int = 0
    expires: float = 0.0


def checksum(ptr: int, size: int) -> int:
    """xxh3-64 of ``size`` bytes of host memory at ``ptr`` (no copy)."""
    return xxhash.xxh3_64_intdigest(memoryview((ctypes.c_char * size).from_address(ptr)))


class KVPool:
    """One worker's view of the pool over its KV slab at ``slab_ptr`` (host memory).

    Lifecycle: construct (registers the slab for zero-copy transfers) -> ``lookup`` /
    ``save`` / ``load`` and the request-scoped ``put_partial`` / ``take_partial``, with
    :meth:`sweep` called now and then to expire this writer's uncollected partial blocks ->
    :meth:`close` (unregisters). Not thread-safe: one engine thread owns it.
    """

    def __init__(
        self,
        store: MooncakeStore,
        namespace: Namespace,
        layout: KVLayout,
        slab_ptr: int,
        writer: str,
        request_ttl_s: float = 60.0,
    ) -> None:
        self.store = store
        self.namespace = namespace
        self.layout = layout
        self.slab_ptr = slab_ptr
        self.writer = writer
        self.request_ttl_s = request_ttl_s
        self.keys = KeySpace.of(namespace, layout.num_layers)
        self.stats = PoolStats()
        self._leases: list[tuple[float, str]] = []  # (expiry, request id), a heap
        store.register(slab_ptr, layout.slab_bytes)

    def _spans(self, page: int) -> list[int]:
        return [
            self.slab_ptr + self.layout.offset(layer, page)
            for layer in range(self.layout.num_layers)
        ]

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
                self._heal(self.keys.meta_key(h))
            out.append(not complete)
        return out

    def begin_write(self, blocks: list[tuple[str, int, dict[str, float]]]) -> BlockWrite:
        """Start writing blocks given as ``(meta key, page, extra meta fields)``.

        The caller writes every layer (:meth:`BlockWrite.write_layer`, in any order, from one
        thread at a time, e.g. each layer as soon as the model computed it) and then calls
        :meth:`BlockWrite.commit`, which publishes the metas of the blocks whose every layer
        landed.
        """
        return BlockWrite(self, blocks)

    def save(self, hashes: list[int], pages: list[int]) -> int:
        """Publish full blocks (``hashes[i]`` computed in ``pages[i]``) that the pool lacks.

        Returns how many blocks this call committed. A block whose layer puts fail (e.g. the
        pool is full) is not committed.
        """
        todo: list[PendingBlock] = [
            (self.keys.meta_key(h), page, {})
            for h, page, missing in zip(hashes, pages, self.absent(hashes), strict=True)
            if missing
        ]
        return self.begin_write(todo).write_all()

    def _meta(self, sums: list[int], extra: dict[str, float]) -> bytes:
        meta = {
            "v": META_VERSION,
            "ns": self.namespace.key,
            "wire": self.layout.wire,
            "writer": self.writer,
            "sums": sums,
            **extra,
        }
        return json.dumps(meta, separators=(",", ":")).encode()

    # -- read ------------------------------------------------------------------------------
    def parse_meta(self, raw: bytes) -> BlockMeta | None:
        try:
            meta = json.loads(raw)
            if (
                meta["v"] == META_VERSION
                and meta["ns"] == self.namespace.key
                and meta["wire"] == self.layout.wire
                and len(meta["sums"]) == self.layout.num_layers
            ):
                return BlockMeta(
                    sums=[int(x) for x in meta["sums"]],
                    tokens=int(meta.get("tokens", 0)),
                    expires=float(meta.get("expires", 0.0)),
                )
        except (ValueError, KeyError, TypeError):
            pass
        self.stats.bad_meta += 1
        return None

    def load(self, hashes: list[int], pages: list[int]) -> int:
        """Read the leading present blocks of ``hashes`` into ``pages``; verify every layer.

        Returns how many leading blocks were loaded and verified. Pages past that count may
        hold partial data and must be treated as not computed.
        """
        t0 = time.perf_counter()
        loaded = self._read_blocks([self.keys.meta_key(h) for h in hashes], pages)
        self.stats.hit_blocks += loaded
        self.stats.miss_blocks += len(hashes) - loaded
        self.stats.hit_tokens += loaded * self.layout.block_tokens
        self.stats.miss_tokens += (len(hashes) - loaded) * self.layout.block_tokens
        self.stats.read_seconds += time.perf_counter() - t0
        return loaded

    def _leading_metas(self, meta_keys: list[str]) -> list[BlockMeta]:
        """The parsed metas of ``meta_keys`` up to the first missing or unfit one."""
        metas: list[BlockMeta] = []
        for raw in self.store.get_bytes(meta_keys):
            meta = self.parse_meta(raw) if raw else None
            if meta is None:
                break
            metas.append(meta)
        return metas

    def _read_blocks(
        self, meta_keys: list[str], pages: list[int], metas: list[BlockMeta] | None = None
    ) -> int:
        """Layers of the blocks named by ``meta_keys`` into ``pages``; leading verified count.

        ``metas`` are fetched here unless the caller already has them.
        """
        metas = self._leading_metas(meta_keys) if metas is None else metas
        size = self.layout.span_bytes
        per = self.layout.num_layers
        keys = [k for meta_key in meta_keys[: len(metas)] for k in self.keys.layer_keys(meta_key)]
        ptrs = [ptr for page in pages[: len(metas)] for ptr in self._spans(page)]
        got = self.store.get_into(keys, ptrs, [size] * len(keys))
        self.stats.objects_read += len(keys)
        self.stats.bytes_read += sum(g for g in got if g > 0)
        for i, meta in enumerate(metas):
            if not self.verify_block(got[i * per : (i + 1) * per], pages[i], meta.sums):
                self._heal(meta_keys[i])
                return i
        return len(metas)

    def verify_block(self, got: list[int], page: int, sums: list[int]) -> bool:
        size = self.layout.span_bytes
        if any(g != size for g in got):
            self.stats.short_reads += 1
            return False
        for ptr, expected in zip(self._spans(page), sums, strict=True):
            if checksum(ptr, size) != expected:
                self.stats.checksum_failures += 1
                return False
        return True

    def _heal(self, meta_key: str) -> None:
        """Remove a block that failed verification so a writer can publish it again."""
        self.store.remove([meta_key, *self.keys.layer_keys(meta_key)])
        self.stats.healed_blocks += 1

    # -- request-scoped partial blocks ------------------------------------------------------
    def partial_block(self, request_id: str, page: int, num_tokens: int) -> PendingBlock:
        """A request's partial last block (``num_tokens`` valid), for :meth:`begin_write`.

        Its meta carries the token count and a lease; call :meth:`lease` once it is
        committed so :meth:`sweep` removes it if the decode side never takes it.
        """
        assert 0 < num_tokens <= self.layout.block_tokens
        expires = time.time() + self.request_ttl_s
        return (self.keys.request_key(request_id), page, {"tokens": num_tokens, "expires": expires})

    def lease(self, request_id: str, expires: float) -> None:
        heapq.heappush(self._leases, (expires, request_id))

    def put_partial(self, request_id: str, page: int, num_tokens: int) -> bool:
        """Publish a request's partial last block (``num_tokens`` valid) under a lease."""
        block = self.partial_block(request_id, page, num_tokens)
        ok = self.begin_write([block]).write_all() == 1
        if ok:
            self.lease(request_id, block[2]["expires"])
        return ok

    def take_partial(self, request_id: str, page: int) -> int | None:
        """Read a request's partial block into ``page`` and delete it from the pool.

        Returns its number of valid tokens, or ``None`` if it is absent, expired or fails
        verification (then the caller recomputes those tokens).
        """
        key = self.keys.request_key(request_id)
        metas = [m for m in self._leading_metas([key]) if m.expires > time.time()]
        ok = bool(metas) and self._read_blocks([key], [page], metas) == 1
        self.drop_partial(request_id)
        return metas[0].tokens if ok else None

    def drop_partial(self, request_id: str) -> bool:
        """Delete a request's partial block; False if it was not there."""
        key = self.keys.request_key(request_id)
        return self.store.remove([key, *self.keys.layer_keys(key)])[0] == 0

    def sweep(self, now: float | None = None) -> int:
        """Remove this writer's partial blocks whose lease ran out; returns how many."""
        now = time.time() if now is None else now
        expired = 0
        while self._leases and self._leases[0][0] <= now:
            _, request_id = heapq.heappop(self._leases)
            expired += self.drop_partial(request_id)
        self.stats.expired_requests += expired
        return expired

    def close(self) -> None:
        self.store.unregister(self.slab_ptr)


class BlockWrite:
    """Blocks being written to the pool, one layer at a time (see :meth:`KVPool.begin_write`).

    Lifecycle: ``write_layer(i)`` for every layer (each puts that layer's span of every
    block and checksums it) -> ``commit()`` (metas of the blocks whose layers all landed;
    returns how many). Layer writes may run on a helper thread while the model computes the
    next layer; ``commit`` must come after the last of them.
    """

    def __init__(self, pool: KVPool, blocks: list[PendingBlock]) -> None:
        self.pool = pool
        self.blocks = blocks
        self.ok = [True] * len(blocks)
        self.sums: list[list[int]] = [[0] * pool.layout.num_layers for _ in blocks]
        self.seconds = 0.0
        self.bytes = 0

    def write_layer(self, layer: int) -> None:
        if not self.blocks:
            return
        t0 = time.perf_counter()
        pool, size = self.pool, self.pool.layout.span_bytes
        ptrs = [pool.slab_ptr + pool.layout.offset(layer, page) for _, page, _ in self.blocks]
        keys = [f"{meta}/{layer}" for meta, _, _ in self.blocks]
        codes = pool.store.put_from(keys, ptrs, [size] * len(keys))
        for i, (code, ptr) in enumerate(zip(codes, ptrs, strict=True)):
            if code != 0:
                self.ok[i] = False
            else:
                self.sums[i][layer] = checksum(ptr, size)
                self.bytes += size
        self.seconds += time.perf_counter() - t0

    def commit(self) -> int:
        t0 = time.perf_counter()
        pool = self.pool
        metas = [
            (meta, pool._meta(sums, extra))
            for (meta, _, extra), ok, sums in zip(self.blocks, self.ok, self.sums, strict=True)
            if ok
        ]
        if metas:
            pool.store.put_bytes([k for k, _ in metas], [v for _, v in metas])
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
        for layer in range(self.pool.layout.num_layers):
            self.write_layer(layer)
        return self.commit()
