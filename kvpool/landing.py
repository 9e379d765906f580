"""Pulling blocks into pages while another worker is still writing them (decode side).

A decode worker reserves pages for a request before the prefill worker starts; from then on
it can read each (block, layer) object as soon as it lands in the pool, so by the time the
prefill returns its first token little is left to move. One :class:`Lander` thread serves
every pending :class:`Landing` of a worker:

1. ``Lander.add(Landing(...))``: the landing's (block, layer) objects are polled in
   block-major order through a sliding window (the order a chunked prefill writes them);
   those that exist are read into their (reserved, not yet used) pages (in place, or
   through the pool's staging slots: :mod:`kvpool.span_io`), each digested as it is
   read. A read that fails (e.g. the object was evicted meanwhile) makes
   that block and every later one unusable: they are no longer polled;
2. when every usable layer is in, the blocks' metas are polled until they exist (a writer
   puts them last). Each meta is checked as it is fetched (:meth:`KVPool.parse_meta`:
   namespace, layout, and the MAC under the pool block key); one that fails makes its
   block and every later one unusable at once (a forged one is counted and removed). Then
   every block is verified against its meta's digests, in order (this last step only
   compares bytes);
3. :meth:`Landing.wait` returns the metas of the leading verified blocks (blocks after the
   first failure are not usable: the caller recomputes them). Nothing else of a landing
   reaches the model: pages of a block that failed are treated as not computed.

A landing that ends early keeps what it verified: past its deadline, while the pool is out
(:attr:`kvpool.store.MooncakeStore.available`), or cancelled (:meth:`Lander.cancel`), the
leading blocks whose every layer was read in full are verified then (:meth:`Landing.finish`:
their metas are fetched if not seen yet; no page is read or written). Once ``cancel``
returns, the thread never touches that landing's pages again (they may be reused).

A caller that knows every object should exist by now (the prefill answered) waits with
:meth:`Landing.settle`: until the landing is over, or until it made no progress for
:data:`STALL_S`, so a block that never lands costs a short stall, not a fixed timeout.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import NamedTuple

from kvpool.pool import BlockMeta, KVPool
from kvpool.span_io import CacheSpan

log = logging.getLogger(__name__)
WINDOW = 256
"""(block, layer) objects polled per round for one landing."""
POLL_S = 0.002
MAX_POLL_S = 0.032
"""Rounds that find nothing new back off up to this (polling competes with the compute of
a prefill on the same cores); :meth:`Lander.nudge` polls at once."""
STALL_S = 0.5
"""How long a landing may go without a new object or meta, once its prefill answered,
before the waiter gives up on the rest (:meth:`Landing.settle`). When the prefill answers,
its layers are in the pool and its metas' commit is queued behind them on the writer's
helper thread: the metas land within milliseconds, and a nudged landing polls every
``POLL_S``-``MAX_POLL_S`` (one round of reads of ``WINDOW`` objects takes tens of
milliseconds over loopback TCP). Half a second is over ten times that on a loaded 2-core
machine, yet a small fraction of the cost of waiting out a fixed cap; what is still missing
then (a put that failed on a full pool, an eviction) will not come, and is recomputed."""


class Span(NamedTuple):
    """One (block, layer) object of a landing: layer ``layer`` of its ``block``-th block
    (an index into ``Landing.meta_keys`` and ``Landing.pages``)."""

    block: int
    layer: int


class Landing:
    """One request's pull: ``meta_keys[i]`` (full blocks, then any partial block) into
    ``pages[i]``, until ``deadline`` (``time.monotonic()``)."""

    def __init__(self, pool: KVPool, meta_keys: list[str], pages: list[int], deadline: float):
        self.pool = pool
        self.meta_keys = meta_keys
        self.pages = pages
        self.deadline = deadline
        layers = pool.layout.num_layers
        self.pending = [Span(i, layer) for i in range(len(meta_keys)) for layer in range(layers)]
        """Objects not read yet, block-major (the order a chunked prefill writes them)."""
        self.got = [[0] * layers for _ in meta_keys]
        self.sums = [[b""] * layers for _ in meta_keys]
        self.usable = len(meta_keys)
        """Blocks that may still verify: a failed read of a layer of block ``i``, or a meta
        of block ``i`` that fails its checks, makes it at most ``i`` (later blocks are not
        polled any more)."""
        self.read_limit = len(meta_keys)
        """Like ``usable``, for failed reads only (a verified run that stops there is a
        short read)."""
        self.metas: list[BlockMeta | None] | None = None
        self.verified: list[BlockMeta] = []
        self.read_seconds = 0.0
        """Time in reads (the transfer itself; polls not included)."""
        self.bytes = 0
        self.done = threading.Event()
        self.progressed = False
        self.last_progress = time.monotonic()
        """When an object was last read or a new meta last seen (``time.monotonic()``)."""
        self.over = False
        """Whether :meth:`finish` ran (``verified`` is final)."""

    def step(self) -> bool:
        """One round of polling and reading; True when the landing is over (``progressed``
        says whether this round read anything or saw a new meta)."""
        self.progressed = False
        if time.monotonic() > self.deadline or not self.pool.store.available:
            self.finish()  # past its lease, or the pool is out: keep what is verified
            return True
        if self.pending:
            return self._read_landed()
        return self._poll_metas()

    def _read_landed(self) -> bool:
        window = self.pending[:WINDOW]
        keys = [f"{self.meta_keys[i]}/{layer}" for i, layer in window]
        flags = self.pool.store.exists(keys)
        ready = [span for span, flag in zip(window, flags, strict=True) if flag == 1]
        if ready:
            t0 = time.perf_counter()
            got = self.pool.io.receive(
                [f"{self.meta_keys[i]}/{layer}" for i, layer in ready],
                [CacheSpan(layer, self.pages[i]) for i, layer in ready],
            )
            for (i, layer), (n, digest) in zip(ready, got, strict=True):
                self.got[i][layer] = n
                self.bytes += max(n, 0)
                if n == self.pool.layout.span_bytes:
                    self.sums[i][layer] = digest
                else:
                    self.usable = min(self.usable, i)
                    self.read_limit = min(self.read_limit, i)
            done = set(ready)
            self.pending = [s for s in self.pending if s not in done and s.block < self.usable]
            self.read_seconds += time.perf_counter() - t0
            self._progress()
        return False

    def _progress(self) -> None:
        self.progressed = True
        self.last_progress = time.monotonic()

    def _fetch_metas(self, start: int, stop: int) -> list[BlockMeta | None]:
        """The checked metas of blocks ``start`` to ``stop`` (``None``: not there yet), up
        to the first that fails its checks: from that one on nothing is usable."""
        keys = self.meta_keys[start:stop]
        metas: list[BlockMeta | None] = []
        for i, (key, raw) in enumerate(zip(keys, self.pool.store.get_bytes(keys), strict=True)):
            meta = self.pool.parse_meta(raw, key) if raw else None
            if meta is not None and not isinstance(meta, BlockMeta):  # bad or forged
                self.usable = min(self.usable, start + i)
                self.pending = [s for s in self.pending if s.block < self.usable]
                break
            metas.append(meta)
        return metas

    def _poll_metas(self) -> bool:
        metas = self._fetch_metas(0, self.usable)
        seen = sum(m is not None for m in metas)
        if seen > sum(m is not None for m in self.metas or []):
            self._progress()
        self.metas = metas
        if seen < len(metas):
            return False
        self.finish()
        return True

    def finish(self) -> None:
        """End the landing, keeping what it verified: the leading blocks whose every layer
        was read in full (and that precede any failed read) are checked against their metas,
        fetched now for those not seen yet. Touches no page (each object was digested as it
        was read). Runs once; the caller sets ``done``."""
        if self.over:
            return
        self.over = True
        unread = {span.block for span in self.pending}
        n = next((i for i in range(self.usable) if i in unread), self.usable)
        metas = list(self.metas or [])[:n]
        metas += [None] * (n - len(metas))
        gap = next((i for i, meta in enumerate(metas) if meta is None), n)
        if gap < n:
            metas[gap:] = self._fetch_metas(gap, n)
        self._verify(metas[: self.usable])

    def _verify(self, metas: list[BlockMeta | None]) -> None:
        stats = self.pool.stats
        for i, meta in enumerate(metas):
            if meta is None:
                break
            if self.sums[i] != meta.sums:
                stats.checksum_failures += 1
                break
            self.verified.append(meta)
        if len(self.verified) == self.read_limit < len(self.meta_keys):
            stats.short_reads += 1  # what stopped the verified run was a failed read
        stats.objects_read += sum(1 for block in self.got for n in block if n > 0)
        stats.bytes_read += self.bytes
        stats.read_seconds += self.read_seconds

    def wait(self, timeout: float) -> list[BlockMeta]:
        """The leading verified blocks' metas, once the landing is over (or ``[]`` if it
        is not over within ``timeout``: cancel it then, and take ``wait(0.0)`` after)."""
        return self.verified if self.done.wait(timeout) else []

    def settle(self, stall_s: float, timeout: float) -> bool:
        """Block (off any event loop) until the landing is over (True), or until it made no
        progress (no object read, no new meta seen) for ``stall_s``, or ``timeout`` passed
        (False: cancel it; what it verified is kept). Stall time counts from this call at the
        earliest: call it when every object should exist (its prefill answered). Sleeps on
        ``done`` between checks; never spins."""
        start = time.monotonic()
        cap = start + timeout
        while True:
            now = time.monotonic()
            left = min(cap, max(self.last_progress, start) + stall_s) - now
            if left <= 0:
                return self.done.is_set()
            if self.done.wait(left):
                return True


class Lander:
    """The thread that steps every pending landing. Lifecycle: construct (starts the thread)
    -> ``add`` / ``cancel`` -> :meth:`close`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._active: list[Landing] = []
        self._wake = threading.Event()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="kv-landing", daemon=True)
        self._thread.start()

    def add(self, landing: Landing) -> Landing:
        with self._lock:
            self._active.append(landing)
        self._wake.set()
        return landing

    def cancel(self, landing: Landing, keep: bool = True) -> None:
        """End ``landing`` now; after this returns its pages are never touched again.

        ``keep``: verify the blocks it read in full (:meth:`Landing.finish`; one batched
        meta fetch at most) so :meth:`Landing.wait` returns them; without it (the pages go
        back anyway) ``wait`` returns ``[]`` unless the landing had ended by itself."""
        with self._lock:
            if landing in self._active:
                self._active.remove(landing)
                if keep:
                    try:
                        landing.finish()
                    except Exception:  # the rest is recomputed; verified stays a prefix
                        log.exception("verifying a cancelled landing failed")
            landing.done.set()

    def nudge(self) -> None:
        """Poll now (a prefill just answered: its KV is all in the pool)."""
        self._wake.set()

    def _run(self) -> None:
        delay = POLL_S
        while not self._closed:
            progressed = False
            with self._lock:
                for landing in list(self._active):
                    try:
                        over = landing.step()
                    except Exception:
                        log.exception("landing KV from the pool failed; it will be recomputed")
                        over = True
                    progressed |= landing.progressed
                    if over:
                        self._active.remove(landing)
                        landing.done.set()
                idle = not self._active
            delay = POLL_S if progressed else min(2 * delay, MAX_POLL_S)
            self._wake.wait(1.0 if idle else delay)
            self._wake.clear()

    def close(self) -> None:
        with self._lock:
            for landing in self._active:
                landing.done.set()
            self._active.clear()
            self._closed = True
        self._wake.set()
        self._thread.join(5)
