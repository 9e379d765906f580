"""Full KV blocks between one worker's slab and the shared pool, keyed by prefix hash.

Key space (every key starts with the namespace tag ``kv<hash version>.<namespace seed>``,
which digests model identity, dtype, KV layout, block size and hash version):

- ``<tag>/b/<block hash>/<writer>/<layer>``: one (layer, block) span, written by ``writer``;
- ``<tag>/b/<block hash>``: the block's *meta* object: namespace text, wire layout, the
  writer, and one xxh3-64 checksum per layer.

Commit rule: a writer puts all layer objects of a block first and the meta object last,
and only when every layer put succeeded. A block is *present* exactly when its meta object
exists; the first writer's meta wins and names whose layers to read, so layers of two
writers are never mixed. Readers verify every layer against the meta checksums: a missing
meta, a layout or namespace mismatch, a short read, a missing layer or a checksum mismatch
makes that block and every later one a miss (counted), so nothing unverified is ever used
as KV.
"""

from __future__ import annotations

import ctypes
import json
import time
from dataclasses import dataclass, field

import xxhash

from kvpool.hashing import Namespace
from kvpool.layout import KVLayout
from kvpool.store import MooncakeStore

META_VERSION = 1


@dataclass
class PoolStats:
    """Counters since start (read by metrics exporters)."""

    blocks_written: int = 0
    objects_written: int = 0
    bytes_written: int = 0
    objects_read: int = 0
    bytes_read: int = 0
    lookups: int = 0
    hit_blocks: int = 0
    miss_blocks: int = 0
    checksum_failures: int = 0
    short_reads: int = 0
    bad_meta: int = 0
    write_seconds: float = 0.0
    read_seconds: float = 0.0
    lookup_seconds: float = 0.0
    extra: dict[str, int] = field(default_factory=dict)


def checksum(ptr: int, size: int) -> int:
    """xxh3-64 of ``size`` bytes of host memory at ``ptr`` (no copy)."""
    return xxhash.xxh3_64_intdigest(memoryview((ctypes.c_char * size).from_address(ptr)))


class KVPool:
    """One worker's view of the pool over its KV slab at ``slab_ptr`` (host memory).

    Lifecycle: construct (registers the slab for zero-copy transfers) -> ``lookup`` /
    ``save`` / ``load`` from the worker's threads -> :meth:`close` (unregisters).
    """

    def __init__(
        self,
        store: MooncakeStore,
        namespace: Namespace,
        layout: KVLayout,
        slab_ptr: int,
        writer: str,
    ) -> None:
        if "/" in writer or not writer:
            raise ValueError(f"writer id must be non-empty without '/', got {writer!r}")
        self.store = store
        self.namespace = namespace
        self.layout = layout
        self.slab_ptr = slab_ptr
        self.writer = writer
        self.tag = f"kv{namespace.hash_version}.{namespace.seed:016x}"
        self.stats = PoolStats()
        store.register(slab_ptr, layout.slab_bytes)

    # -- keys ------------------------------------------------------------------------------
    def meta_key(self, block_hash: int) -> str:
        return f"{self.tag}/b/{block_hash:016x}"

    def layer_key(self, block_hash: int, writer: str, layer: int) -> str:
        return f"{self.tag}/b/{block_hash:016x}/{writer}/{layer}"

    def _span(self, layer: int, page: int) -> int:
        return self.slab_ptr + self.layout.offset(layer, page)

    # -- lookup ----------------------------------------------------------------------------
    def lookup(self, hashes: list[int]) -> int:
        """How many leading blocks of the chain ``hashes`` are present (one batched call)."""
        t0 = time.perf_counter()
        flags = self.store.exists([self.meta_key(h) for h in hashes])
        n = next((i for i, f in enumerate(flags) if f != 1), len(flags))
        self.stats.lookups += 1
        self.stats.lookup_seconds += time.perf_counter() - t0
        return n

    # -- write -----------------------------------------------------------------------------
    def save(self, hashes: list[int], pages: list[int]) -> int:
        """Publish full blocks (``hashes[i]`` computed in ``pages[i]``) that the pool lacks.

        Returns how many blocks this call committed. A block whose layer puts fail is not
        committed (its layers are removed); one that another writer committed first is left.
        """
        t0 = time.perf_counter()
        flags = self.store.exists([self.meta_key(h) for h in hashes])
        todo = [(h, p) for h, p, f in zip(hashes, pages, flags, strict=True) if f != 1]
        layers = range(self.layout.num_layers)
        size = self.layout.span_bytes
        keys = [self.layer_key(h, self.writer, layer) for h, _ in todo for layer in layers]
        ptrs = [self._span(layer, p) for _, p in todo for layer in layers]
        # Upsert: a layer left by an earlier failed save of ours must not survive.
        codes = self.store.upsert_from(keys, ptrs, [size] * len(keys))
        metas: list[tuple[str, bytes]] = []
        failed: list[str] = []
        per_block = self.layout.num_layers
        for i, (h, p) in enumerate(todo):
            block_codes = codes[i * per_block : (i + 1) * per_block]
            block_keys = keys[i * per_block : (i + 1) * per_block]
            if any(c != 0 for c in block_codes):
                failed.extend(block_keys)
                continue
            sums = [checksum(self._span(layer, p), size) for layer in layers]
            metas.append((self.meta_key(h), self._meta(sums)))
        self.store.remove(failed)
        self.store.put_bytes([k for k, _ in metas], [v for _, v in metas])
        written = len(metas)
        self.stats.blocks_written += written
        self.stats.objects_written += written * (per_block + 1)
        self.stats.bytes_written += written * per_block * size
        self.stats.write_seconds += time.perf_counter() - t0
        return written

    def _meta(self, sums: list[int]) -> bytes:
        return json.dumps(
            {
                "v": META_VERSION,
                "ns": self.namespace.key,
                "wire": self.layout.wire,
                "writer": self.writer,
                "sums": sums,
            },
            separators=(",", ":"),
        ).encode()

    # -- read ------------------------------------------------------------------------------
    def _parse_meta(self, raw: bytes) -> tuple[str, list[int]] | None:
        try:
            meta = json.loads(raw)
            ok = (
                meta["v"] == META_VERSION
                and meta["ns"] == self.namespace.key
                and meta["wire"] == self.layout.wire
                and len(meta["sums"]) == self.layout.num_layers
            )
            return (str(meta["writer"]), [int(s) for s in meta["sums"]]) if ok else None
        except (ValueError, KeyError, TypeError):
            return None

    def load(self, hashes: list[int], pages: list[int]) -> int:
        """Read the leading present blocks of ``hashes`` into ``pages``; verify every layer.

        Returns how many leading blocks were loaded and verified. Pages past that count may
        hold partial data and must be treated as not computed.
        """
        t0 = time.perf_counter()
        metas = []
        for raw in self.store.get_bytes([self.meta_key(h) for h in hashes]):
            meta = self._parse_meta(raw) if raw else None
            if meta is None:
                self.stats.bad_meta += bool(raw)
                break
            metas.append(meta)
        size = self.layout.span_bytes
        layers = range(self.layout.num_layers)
        keys = [
            self.layer_key(h, writer, layer)
            for h, (writer, _) in zip(hashes[: len(metas)], metas, strict=True)
            for layer in layers
        ]
        ptrs = [self._span(layer, p) for p in pages[: len(metas)] for layer in layers]
        got = self.store.get_into(keys, ptrs, [size] * len(keys))
        loaded = 0
        for i, (_, sums) in enumerate(metas):
            if not self._verify(got[i * len(layers) : (i + 1) * len(layers)], pages[i], sums):
                break
            loaded += 1
        self.stats.objects_read += len(keys)
        self.stats.bytes_read += sum(g for g in got if g > 0)
        self.stats.hit_blocks += loaded
        self.stats.miss_blocks += len(hashes) - loaded
        self.stats.read_seconds += time.perf_counter() - t0
        return loaded

    def _verify(self, got: list[int], page: int, sums: list[int]) -> bool:
        size = self.layout.span_bytes
        if any(g != size for g in got):
            self.stats.short_reads += 1
            return False
        for layer, expected in enumerate(sums):
            if checksum(self._span(layer, page), size) != expected:
                self.stats.checksum_failures += 1
                return False
        return True

    def close(self) -> None:
        self.store.unregister(self.slab_ptr)
