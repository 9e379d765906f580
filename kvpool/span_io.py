"""How a pool's bytes move between a worker's KV cache and the store: in place, or staged.

Every transfer is a list of (layer, page) spans (:class:`CacheSpan`), each one pool object
of ``span_bytes`` (:mod:`kvpool.layout`). Two ways to move them:

- :class:`DirectIO` (a KV cache in host memory): the cache's slab itself is registered
  with the store; puts read the spans in place, gets write them in place, and each span's
  digest is taken over the same memory.
- :class:`StagedIO` (a KV cache on a GPU, or any cache with ``--kv-staging always``): a
  host slab of span-sized *slots* (pinned on a GPU machine) is registered instead. A send
  copies its spans into slots (:meth:`SpanCopier.to_host`: on a GPU, on a side stream,
  after the compute that produced the layer, which :meth:`SpanCopier.mark` recorded), puts
  them from there and digests the host copy; a receive gets objects into slots, digests
  them there, and copies the ones read in full into their pages
  (:meth:`SpanCopier.to_device`). A copier with ``in_place`` set (``--kv-staging never``
  on a GPU: GPUDirect RDMA with Mooncake's CUDA build) has the device slab registered as
  it is: transfers go straight to and from the device, and the slots carry only the host
  copies the digests are taken over.

Slots are taken from a :class:`SlotPool` in rounds of at most a quarter of them, each round
taken whole and given back before the next is asked for, so the pool's threads (the
engine, its layer writer, its lander) share the slots without deadlock. The copier does
the device copies (``workers.handoff.staging``, over torch); this module stays free of torch.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import NamedTuple, Protocol

from kvpool.layout import KVLayout
from kvpool.store import MooncakeStore

Digest = Callable[[int, int], bytes]
"""``digest(ptr, size)``: a span's digest in the namespace's algorithm (host memory)."""


class CacheSpan(NamedTuple):
    """Layer ``layer`` of page ``page``: one pool object's bytes in the KV cache."""

    layer: int
    page: int


class Received(NamedTuple):
    """One span of a receive: ``nbytes`` read (negative: an error) and, when it was read
    in full, its ``digest`` (else ``b""``); only a span read in full reached its page."""

    nbytes: int
    digest: bytes


class SpanCopier(Protocol):
    """Moves spans between a KV cache and host slots (``workers.handoff.staging.TorchCopier``).

    The slots are ``num_slots`` consecutive spans of host memory at ``host_ptr``; the cache's
    slab starts at ``cache_ptr`` (host or device memory). Copies may be called from several
    threads at once (on different slots)."""

    host_ptr: int
    num_slots: int
    cache_ptr: int
    in_place: bool
    """Register the cache at ``cache_ptr`` with the store as it is and transfer in place
    (the slots then only carry host copies for the digests)."""

    def mark(self) -> object | None:
        """A point in the compute so far (on a GPU, an event on the compute stream), taken on
        the thread that computes; ``None`` where compute is synchronous."""

    def to_host(
        self, spans: Sequence[CacheSpan], slots: Sequence[int], after: object | None
    ) -> None:
        """Copy ``spans`` into ``slots``, after the compute up to ``after``; returns once the
        copies landed."""

    def to_device(self, slots: Sequence[int], spans: Sequence[CacheSpan]) -> None:
        """Copy ``slots`` into their ``spans``' pages; returns once the copies landed."""


class SlotPool:
    """Slot numbers ``0..n-1`` handed out in whole rounds (a round waits for enough free)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self._free = list(range(n))
        self._cond = threading.Condition()

    @contextmanager
    def taken(self, k: int) -> Iterator[list[int]]:
        """``k`` (at most ``n``) slots for the ``with`` block; given back after it."""
        assert 0 < k <= self.n
        with self._cond:
            self._cond.wait_for(lambda: len(self._free) >= k)
            slots, self._free = self._free[:k], self._free[k:]
        try:
            yield slots
        finally:
            with self._cond:
                self._free += slots
                self._cond.notify_all()


class DirectIO:
    """Spans moved in place in a host-memory slab at ``slab_ptr`` (registered here)."""

    def __init__(self, store: MooncakeStore, layout: KVLayout, slab_ptr: int, digest: Digest):
        self.store, self.layout, self.slab_ptr, self.digest = store, layout, slab_ptr, digest
        store.register(slab_ptr, layout.slab_bytes)

    def _ptrs(self, spans: Sequence[CacheSpan]) -> list[int]:
        return [self.slab_ptr + self.layout.offset(layer, page) for layer, page in spans]

    def mark(self) -> object | None:
        return None

    def send(
        self, keys: Sequence[str], spans: Sequence[CacheSpan], after: object | None = None
    ) -> list[bytes | None]:
        """Put ``spans`` under ``keys``; per span its digest, or ``None`` if its put failed."""
        size, ptrs = self.layout.span_bytes, self._ptrs(spans)
        codes = self.store.put_from(list(keys), ptrs, [size] * len(ptrs))
        return [self.digest(p, size) if c == 0 else None for c, p in zip(codes, ptrs, strict=True)]

    def receive(
        self,
        keys: Sequence[str],
        spans: Sequence[CacheSpan],
        expected: Sequence[bytes] | None = None,
    ) -> list[Received]:
        """Get ``keys`` into ``spans``; per span what was read and its digest. In place,
        every byte read is in the pages already: ``expected`` (see :meth:`StagedIO.receive`)
        is not used."""
        size, ptrs = self.layout.span_bytes, self._ptrs(spans)
        got = self.store.get_into(list(keys), ptrs, [size] * len(ptrs))
        return [
            Received(n, self.digest(p, size) if n == size else b"")
            for n, p in zip(got, ptrs, strict=True)
        ]

    def close(self) -> None:
        self.store.unregister(self.slab_ptr)


class StagedIO:
    """Spans moved through the host slots of ``copier`` (see the module docstring)."""

    def __init__(
        self, store: MooncakeStore, layout: KVLayout, copier: SpanCopier, digest: Digest
    ) -> None:
        self.store, self.layout, self.copier, self.digest = store, layout, copier, digest
        self.slots = SlotPool(copier.num_slots)
        self.round = max(1, copier.num_slots // 4)
        """Spans moved per round (several threads share the slots)."""
        self._direct = (
            DirectIO(store, layout, copier.cache_ptr, digest) if copier.in_place else None
        )
        store.register(copier.host_ptr, copier.num_slots * layout.span_bytes)

    def _slot_ptr(self, slot: int) -> int:
        return self.copier.host_ptr + slot * self.layout.span_bytes

    def mark(self) -> object | None:
        return self.copier.mark()

    def _rounds(self, n: int) -> Iterator[slice]:
        for start in range(0, n, self.round):
            yield slice(start, min(n, start + self.round))

    def _targets(self, spans: Sequence[CacheSpan], slots: list[int]) -> list[int]:
        """Where a round's transfers read or write: the slots, or the pages in place."""
        if self._direct is not None:
            return self._direct._ptrs(spans)
        return [self._slot_ptr(s) for s in slots]

    def send(
        self, keys: Sequence[str], spans: Sequence[CacheSpan], after: object | None = None
    ) -> list[bytes | None]:
        """As :meth:`DirectIO.send`; the digests are taken over the host copies."""
        out: list[bytes | None] = []
        size = self.layout.span_bytes
        for part in self._rounds(len(spans)):
            with self.slots.taken(part.stop - part.start) as slots:
                self.copier.to_host(spans[part], slots, after)
                targets = self._targets(spans[part], slots)
                codes = self.store.put_from(list(keys[part]), targets, [size] * len(slots))
                out += [
                    self.digest(self._slot_ptr(s), size) if c == 0 else None
                    for c, s in zip(codes, slots, strict=True)
                ]
        return out

    def receive(
        self,
        keys: Sequence[str],
        spans: Sequence[CacheSpan],
        expected: Sequence[bytes] | None = None,
    ) -> list[Received]:
        """As :meth:`DirectIO.receive`; digested in the slots (staged: before the copy to
        the pages; in place: over a copy back from them). Staged with ``expected`` (a
        digest per span): only the spans read in full whose digest is the expected one
        reach their pages, so no unverified byte ever does."""
        out: list[Received] = []
        size = self.layout.span_bytes
        for part in self._rounds(len(spans)):
            with self.slots.taken(part.stop - part.start) as slots:
                targets = self._targets(spans[part], slots)
                got = self.store.get_into(list(keys[part]), targets, [size] * len(slots))
                full = [
                    (s, sp) for s, sp, n in zip(slots, spans[part], got, strict=True) if n == size
                ]
                if self._direct is not None:
                    self.copier.to_host([sp for _, sp in full], [s for s, _ in full], None)
                received = [
                    Received(n, self.digest(self._slot_ptr(s), size) if n == size else b"")
                    for n, s in zip(got, slots, strict=True)
                ]
                if self._direct is None and full:
                    wanted = expected[part] if expected is not None else None
                    copy = [
                        (s, sp)
                        for i, (s, sp) in enumerate(zip(slots, spans[part], strict=True))
                        if received[i].nbytes == size
                        and (wanted is None or received[i].digest == wanted[i])
                    ]
                    if copy:
                        self.copier.to_device([s for s, _ in copy], [sp for _, sp in copy])
                out += received
        return out

    def close(self) -> None:
        self.store.unregister(self.copier.host_ptr)
        if self._direct is not None:
            self._direct.close()


SpanIO = DirectIO | StagedIO
