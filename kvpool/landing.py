"""Pulling blocks into pages while another worker is still writing them (decode side).

A decode worker reserves pages for a request before the prefill worker starts; from then on
it can read each (block, layer) object as soon as it lands in the pool, so by the time the
prefill returns its first token little is left to move. One :class:`Lander` thread serves
every pending :class:`Landing` of a worker:

1. ``Lander.add(Landing(...))``: the landing's (block, layer) objects are polled in
   block-major order through a sliding window (the order a chunked prefill writes them);
   those that exist are read straight into their pages;
2. when every layer is in, the blocks' metas are polled until they exist (a writer puts
   them last), then every block is verified against its checksums, in order (each object
   was checksummed as it was read, so this last step only compares numbers);
3. :meth:`Landing.wait` returns the metas of the leading verified blocks (blocks after the
   first failure are not usable: the caller recomputes them). A landing past its deadline,
   or while the pool is out (:attr:`kvpool.store.MooncakeStore.available`), ends with what
   it verified; :meth:`Lander.cancel` ends it at once and, once it returns,
   the thread never touches that landing's pages again (they may be reused).
"""

from __future__ import annotations

import logging
import threading
import time

from kvpool.pool import BlockMeta, KVPool, checksum

log = logging.getLogger(__name__)
WINDOW = 256
"""(block, layer) objects polled per round for one landing."""
POLL_S = 0.002
MAX_POLL_S = 0.032
"""Rounds that find nothing new back off up to this (polling competes with the compute of
a prefill on the same cores); :meth:`Lander.nudge` polls at once."""


class Landing:
    """One request's pull: ``meta_keys[i]`` (full blocks, then any partial block) into
    ``pages[i]``, until ``deadline`` (``time.monotonic()``)."""

    def __init__(self, pool: KVPool, meta_keys: list[str], pages: list[int], deadline: float):
        self.pool = pool
        self.meta_keys = meta_keys
        self.pages = pages
        self.deadline = deadline
        layers = pool.layout.num_layers
        self.pending = [(i, layer) for i in range(len(meta_keys)) for layer in range(layers)]
        self.got = [[0] * layers for _ in meta_keys]
        self.sums = [[0] * layers for _ in meta_keys]
        self.metas: list[BlockMeta | None] | None = None
        self.verified: list[BlockMeta] = []
        self.read_seconds = 0.0
        """Time in reads (the transfer itself; polls not included)."""
        self.bytes = 0
        self.done = threading.Event()
        self.progressed = False

    def step(self) -> bool:
        """One round of polling and reading; True when the landing is over (``progressed``
        says whether this round read anything)."""
        self.progressed = False
        if time.monotonic() > self.deadline or not self.pool.store.available:
            self._verify(self.metas or [])  # past its lease, or the pool is out: recompute
            return True
        if self.pending:
            return self._read_landed()
        return self._poll_metas()

    def _read_landed(self) -> bool:
        window = self.pending[:WINDOW]
        keys = [f"{self.meta_keys[i]}/{layer}" for i, layer in window]
        ready = [
            w for w, flag in zip(window, self.pool.store.exists(keys), strict=True) if flag == 1
        ]
        if ready:
            t0 = time.perf_counter()
            size = self.pool.layout.span_bytes
            base, layout = self.pool.slab_ptr, self.pool.layout
            got = self.pool.store.get_into(
                [f"{self.meta_keys[i]}/{layer}" for i, layer in ready],
                [base + layout.offset(layer, self.pages[i]) for i, layer in ready],
                [size] * len(ready),
            )
            for (i, layer), n in zip(ready, got, strict=True):
                self.got[i][layer] = n
                self.bytes += max(n, 0)
                if n == size:
                    self.sums[i][layer] = checksum(base + layout.offset(layer, self.pages[i]), n)
            done = set(ready)
            self.pending = [w for w in self.pending if w not in done]
            self.read_seconds += time.perf_counter() - t0
            self.progressed = True
        return False

    def _poll_metas(self) -> bool:
        raws = self.pool.store.get_bytes(self.meta_keys)
        metas = [self.pool.parse_meta(raw) if raw else None for raw in raws]
        if any(m is None for m in metas):
            self.metas = metas
            return False
        self._verify(metas)
        return True

    def _verify(self, metas: list[BlockMeta | None]) -> None:
        size = self.pool.layout.span_bytes
        stats = self.pool.stats
        for i, meta in enumerate(metas):
            if meta is None:
                break
            if any(n != size for n in self.got[i]):
                stats.short_reads += 1
                break
            if self.sums[i] != meta.sums:
                stats.checksum_failures += 1
                break
            self.verified.append(meta)
        stats.objects_read += sum(1 for block in self.got for n in block if n > 0)
        stats.bytes_read += self.bytes
        stats.read_seconds += self.read_seconds

    def wait(self, timeout: float) -> list[BlockMeta]:
        """The leading verified blocks' metas, once the landing is over (or ``[]`` if it
        is not over within ``timeout``: cancel it then)."""
        return self.verified if self.done.wait(timeout) else []

    @property
    def progressing(self) -> bool:
        return bool(self.pending)


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

    def cancel(self, landing: Landing) -> None:
        """End ``landing`` now; after this returns its pages are never touched again."""
        with self._lock:
            if landing in self._active:
                self._active.remove(landing)
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
