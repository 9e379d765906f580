"""Reading blocks from the pool one layer at a time, each span verified before it reaches
its page: the load path of an engine that computes layer ``i`` as soon as layer ``i`` of
its prefix has arrived (vLLM's KV connector: ``start_load_kv`` / ``wait_for_layer_load``).

A load is one or more *runs*, each a chain of blocks in order (one request's blocks past
what its engine holds already), maybe ending with a request-scoped partial last block (its
*tail*). Lifecycle of :class:`LayerLoad`:

1. ``LayerLoad(pool, runs)``; :meth:`LayerLoad.read_metas` fetches every block's meta in one
   call and keeps, per run, the leading blocks whose meta is there and fits (namespace,
   layout, MAC: :meth:`kvpool.pool.KVPool.parse_meta`, which counts and removes forged
   ones; a tail's also holds the tokens the run expects, under a live lease);
2. :meth:`LayerLoad.read_layer` for each layer in order: layer ``i`` of every block still
   wanted, in one batch; a span reaches its page only if it was read in full and its digest
   is the meta's (a staged cache: :meth:`kvpool.span_io.StagedIO.receive` with
   ``expected``). A block that fails any layer is cut, with every later block of its run,
   and later layers skip them. Tails and the rest are read in separate calls
   (``tails``): an engine that writes the step's new tokens into a page before it waits
   for that layer's load (vLLM does) reads the tails, whose page the new tokens share,
   before the step, and the full blocks layer by layer while it computes;
3. :meth:`LayerLoad.finish` counts hits and misses, removes the blocks that failed their
   digests (so a writer can publish them again), refreshes what was loaded in the chain
   index, and returns per run how many leading blocks arrived whole. Pages past that count
   hold nothing the engine may use.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import NamedTuple

from kvpool.evictor import chain_parents
from kvpool.meta import BlockMeta
from kvpool.pool import KVPool
from kvpool.span_io import CacheSpan


class LoadRun(NamedTuple):
    """One chain of blocks to read: ``meta_keys[i]`` into ``pages[i]``. ``names`` are the
    full blocks' names with the chain before them (``prefix``: held elsewhere), for the
    chain index; ``tail`` > 0: the last key is a request-scoped partial block (no name)
    that must hold exactly ``tail`` tokens under a lease not yet run out."""

    meta_keys: list[str]
    pages: list[int]
    names: list[int]
    prefix: list[int]
    tail: int = 0


class LayerLoad:
    """One load of several runs, layer by layer (module docstring). Not thread-safe: one
    thread calls :meth:`read_layer` at a time; :meth:`finish` after the last."""

    def __init__(self, pool: KVPool, runs: Sequence[LoadRun]) -> None:
        self.pool = pool
        self.runs = list(runs)
        self.metas: list[list[BlockMeta]] = [[] for _ in self.runs]
        self.good: list[int] = [0] * len(self.runs)
        """Per run, how many leading blocks are still whole (so far)."""
        self._bad: set[str] = set()
        self.bytes = 0
        self.objects = 0
        self.seconds = 0.0

    def read_metas(self) -> None:
        """Step 1: the runs' metas, in one call."""
        t0 = time.perf_counter()
        keys = [k for run in self.runs for k in run.meta_keys]
        raws = iter(self.pool.store.get_bytes(keys) if keys else [])
        now = time.time()
        for r, run in enumerate(self.runs):
            last = len(run.meta_keys) - 1
            for b, key in enumerate(run.meta_keys):
                raw = next(raws)
                meta = self.pool.parse_meta(raw, key) if raw else None
                if not isinstance(meta, BlockMeta) or len(self.metas[r]) != self.good[r]:
                    continue
                if run.tail and b == last and (meta.tokens != run.tail or meta.expires <= now):
                    continue
                self.metas[r].append(meta)
                self.good[r] += 1
        self.seconds += time.perf_counter() - t0

    def read_layer(self, layer: int, tails: bool = False) -> None:
        """Step 2 for ``layer``: read it for every block still whole, verified: the tails
        only, or everything but them."""
        t0 = time.perf_counter()
        keys: list[str] = []
        spans: list[CacheSpan] = []
        sums: list[bytes] = []
        where: list[tuple[int, int]] = []
        for r, run in enumerate(self.runs):
            last = len(run.meta_keys) - 1
            for b in range(self.good[r]):
                if tails != (bool(run.tail) and b == last):
                    continue
                keys.append(f"{run.meta_keys[b]}/{layer}")
                spans.append(CacheSpan(layer, run.pages[b]))
                sums.append(self.metas[r][b].sums[layer])
                where.append((r, b))
        if keys:
            got = self.pool.io.receive(keys, spans, sums)
            self.objects += len(keys)
            size = self.pool.layout.span_bytes
            for (r, b), received, expected in zip(where, got, sums, strict=True):
                if received.nbytes != size:
                    self.pool.stats.short_reads += 1
                elif received.digest != expected:
                    self.pool.stats.checksum_failures += 1
                    self._bad.add(self.runs[r].meta_keys[b])
                else:
                    self.bytes += size
                    continue
                self.good[r] = min(self.good[r], b)
        self.seconds += time.perf_counter() - t0

    def finish(self) -> list[int]:
        """Step 3: per run, how many leading blocks arrived whole."""
        pool, bt = self.pool, self.pool.layout.block_tokens
        for key in self._bad:
            pool.heal(key)
        for run, good in zip(self.runs, self.good, strict=True):
            full = min(good, len(run.names))
            wanted = len(run.names)
            pool.stats.hit_blocks += full
            pool.stats.miss_blocks += wanted - full
            pool.stats.hit_tokens += full * bt
            pool.stats.miss_tokens += (wanted - full) * bt
            if pool.evictor is not None and full:
                used = [*run.prefix, *run.names[:full]]
                pool.evictor.touch(used, chain_parents(used, None))
        pool.stats.objects_read += self.objects
        pool.stats.bytes_read += self.bytes
        pool.stats.read_seconds += self.seconds
        return list(self.good)
