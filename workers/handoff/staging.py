"""The device side of host staging: copies between a KV cache and host slots, over torch.

:class:`TorchCopier` implements :class:`kvpool.span_io.SpanCopier` for a KV cache on any
device, seen through :class:`SpanViews`: each (layer, page) span as a tensor in the wire
order ``[2, block_tokens, kv_heads, head_dim]`` (:mod:`kvpool.layout`). Our engine's slab
holds its spans in that order already (:class:`SlabViews`, a contiguous view each); another
engine's cache may not (vLLM's: ``vllm_backend.layouts``), and the copies then convert, so
the slots always hold the wire bytes the pool stores and digests. Its host slots are one
slab of ``num_slots`` spans (pinned when the cache is on a GPU, so copies run asynchronously
and the transfer engine can read them). On a GPU:

- :meth:`mark` records an event on the computing thread's current stream (no sync);
- :meth:`to_host` makes a side stream wait for that event, queues one device-to-host copy
  per span there, records an event and waits for it (on the calling thread, a helper: the
  engine computes on);
- :meth:`to_device` makes the side stream wait for the compute stream (a page is never
  overwritten under a kernel still reading it), queues the host-to-device copies, and waits
  for them; a page is used by the model only after the landing that filled it is over.

On the CPU the same calls copy synchronously (``mark`` returns ``None``): with
``--kv-staging always`` CI runs every line of the staged path but the stream and event calls.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from kvpool.span_io import CacheSpan

MIN_SLOTS = 4
"""Fewest slots a copier gets, whatever its memory setting (each round takes a quarter)."""


def slots_for(mib: int, span_bytes: int) -> int:
    """How many span-sized slots ``mib`` MiB of staging memory holds (at least
    :data:`MIN_SLOTS`)."""
    return max(MIN_SLOTS, (mib << 20) // span_bytes)


class SpanViews(Protocol):
    """A KV cache's (layer, page) spans as tensors in the wire order (module docstring)."""

    device: torch.device
    dtype: torch.dtype
    span_shape: tuple[int, ...]
    """``(2, block_tokens, kv_heads, head_dim)``."""
    cache_ptr: int
    """Where a cache registered in place starts (only a cache laid out as the wire is)."""

    def __call__(self, span: CacheSpan) -> list[torch.Tensor]:
        """The span's elements as views into the cache: one of ``span_shape``, or one per
        slice ``[i]`` of its first axis (K, then V)."""
        ...


class SlabViews:
    """The spans of a KV slab ``[layers, pages, ...]`` (each ``slab[layer, page]`` one
    contiguous span in the wire order: :class:`workers.core.kv_cache.KVCache`)."""

    def __init__(self, slab: torch.Tensor) -> None:
        assert slab.is_contiguous()
        self.slab = slab
        self.device, self.dtype = slab.device, slab.dtype
        self.span_shape = tuple(slab.shape[2:])
        self.cache_ptr = slab.data_ptr()

    def __call__(self, span: CacheSpan) -> list[torch.Tensor]:
        return [self.slab[span.layer, span.page]]


class TorchCopier:
    """``num_slots`` host slots for the spans ``views`` shows, on any device.

    Lifecycle: construct (allocates and touches the slots) -> handed to
    :class:`kvpool.pool.KVPool`, which registers the slots (and, ``in_place``, the cache at
    ``views.cache_ptr``) -> copies from any thread -> dropped after the pool is closed."""

    def __init__(self, views: SpanViews, num_slots: int, in_place: bool = False) -> None:
        assert num_slots >= 1
        self.views = views
        self.device = views.device
        self.on_gpu = self.device.type == "cuda"
        numel = 1
        for n in views.span_shape:
            numel *= n
        self.span_bytes = numel * views.dtype.itemsize
        self.num_slots = num_slots
        self.host = torch.zeros(
            num_slots, self.span_bytes, dtype=torch.uint8, pin_memory=self.on_gpu
        )
        self.host_ptr = self.host.data_ptr()
        self.cache_ptr = views.cache_ptr
        self.in_place = in_place
        self.stream: torch.cuda.Stream | None = None
        if self.on_gpu:
            self.stream = torch.cuda.Stream(self.device)  # type: ignore[no-untyped-call]

    def _pairs(self, span: CacheSpan, slot: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """``(cache view, slot view)`` pairs that together are ``span`` and slot ``slot``."""
        parts = self.views(span)
        host = self.host[slot].view(self.views.dtype).view(self.views.span_shape)
        return list(zip(parts, [host] if len(parts) == 1 else host.unbind(0), strict=True))

    def mark(self) -> object | None:
        if not self.on_gpu:
            return None
        event = torch.cuda.Event()  # type: ignore[no-untyped-call]
        event.record(torch.cuda.current_stream(self.device))
        return event

    def to_host(
        self, spans: Sequence[CacheSpan], slots: Sequence[int], after: object | None
    ) -> None:
        if self.stream is None:
            for span, slot in zip(spans, slots, strict=True):
                for cache, host in self._pairs(span, slot):
                    host.copy_(cache)
            return
        with torch.cuda.stream(self.stream):
            if isinstance(after, torch.cuda.Event):
                self.stream.wait_event(after)
            else:  # no mark: after everything queued so far
                self.stream.wait_stream(torch.cuda.default_stream(self.device))
            for span, slot in zip(spans, slots, strict=True):
                for cache, host in self._pairs(span, slot):
                    host.copy_(cache, non_blocking=True)
            self._landed()

    def to_device(self, slots: Sequence[int], spans: Sequence[CacheSpan]) -> None:
        if self.stream is None:
            for slot, span in zip(slots, spans, strict=True):
                for cache, host in self._pairs(span, slot):
                    cache.copy_(host)
            return
        with torch.cuda.stream(self.stream):
            self.stream.wait_stream(torch.cuda.default_stream(self.device))
            for slot, span in zip(slots, spans, strict=True):
                for cache, host in self._pairs(span, slot):
                    cache.copy_(host, non_blocking=True)
            self._landed()

    def _landed(self) -> None:
        """Wait (this thread only) until what the side stream queued so far is done."""
        assert self.stream is not None
        done = torch.cuda.Event()  # type: ignore[no-untyped-call]
        done.record(self.stream)
        done.synchronize()
