"""The device side of host staging: copies between a KV cache and host slots, over torch.

:class:`TorchCopier` implements :class:`kvpool.span_io.SpanCopier` for a KV slab on any
device. Its host slots are one slab of
``num_slots`` spans (pinned when the cache is on a GPU, so copies run asynchronously and the
transfer engine can read them). On a GPU:

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

import torch

from kvpool.span_io import CacheSpan

MIN_SLOTS = 4
"""Fewest slots a copier gets, whatever its memory setting (each round takes a quarter)."""


def slots_for(mib: int, span_bytes: int) -> int:
    """How many span-sized slots ``mib`` MiB of staging memory holds (at least
    :data:`MIN_SLOTS`)."""
    return max(MIN_SLOTS, (mib << 20) // span_bytes)


class TorchCopier:
    """``num_slots`` host slots for ``slab``, a KV slab ``[layers, pages, ...]`` on any
    device (each ``slab[layer, page]`` one contiguous span: :class:`workers.kv_cache.KVCache`).

    Lifecycle: construct (allocates and touches the slots) -> handed to
    :class:`kvpool.pool.KVPool`, which registers the slots (and, ``in_place``, the slab) ->
    copies from any thread -> dropped after the pool is closed."""

    def __init__(self, slab: torch.Tensor, num_slots: int, in_place: bool = False) -> None:
        assert num_slots >= 1 and slab.is_contiguous()
        self.slab = slab
        self.device = slab.device
        self.on_gpu = self.device.type == "cuda"
        self.span_bytes = slab[0, 0].numel() * slab.element_size()
        self.num_slots = num_slots
        self.host = torch.zeros(
            num_slots, self.span_bytes, dtype=torch.uint8, pin_memory=self.on_gpu
        )
        self.host_ptr = self.host.data_ptr()
        self.cache_ptr = slab.data_ptr()
        self.in_place = in_place
        self.stream: torch.cuda.Stream | None = None
        if self.on_gpu:
            self.stream = torch.cuda.Stream(self.device)  # type: ignore[no-untyped-call]

    def _span(self, span: CacheSpan) -> torch.Tensor:
        """The bytes of ``span`` in the cache, as a flat uint8 view."""
        return self.slab[span.layer, span.page].view(-1).view(torch.uint8)

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
                self.host[slot].copy_(self._span(span))
            return
        with torch.cuda.stream(self.stream):
            if isinstance(after, torch.cuda.Event):
                self.stream.wait_event(after)
            else:  # no mark: after everything queued so far
                self.stream.wait_stream(torch.cuda.default_stream(self.device))
            for span, slot in zip(spans, slots, strict=True):
                self.host[slot].copy_(self._span(span), non_blocking=True)
            self._landed()

    def to_device(self, slots: Sequence[int], spans: Sequence[CacheSpan]) -> None:
        if self.stream is None:
            for slot, span in zip(slots, spans, strict=True):
                self._span(span).copy_(self.host[slot])
            return
        with torch.cuda.stream(self.stream):
            self.stream.wait_stream(torch.cuda.default_stream(self.device))
            for slot, span in zip(slots, spans, strict=True):
                self._span(span).copy_(self.host[slot], non_blocking=True)
            self._landed()

    def _landed(self) -> None:
        """Wait (this thread only) until what the side stream queued so far is done."""
        assert self.stream is not None
        done = torch.cuda.Event()  # type: ignore[no-untyped-call]
        done.record(self.stream)
        done.synchronize()
