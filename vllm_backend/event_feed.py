"""vLLM's KV events into the worker's KV event stream.

vLLM publishes its prefix cache's changes (``kv_events_config``: ZeroMQ PUB on an
``ipc://`` socket in the worker's private directory; frames: topic, an 8-byte sequence
number, a msgpack ``KVEventBatch``). :class:`EventFeed` subscribes before vLLM starts (a
SUB socket may connect first), decodes each batch on the worker's event loop, names its
blocks (:class:`vllm_backend.cache_names.CacheNames`) and hands the translated events to
the worker's :class:`workers.serve.kv_publisher.EventPublisher` (``collect``), which numbers
them and ships them to the router's index as our engine's are.

A sequence gap (vLLM dropped or this socket missed batches) is counted and logged: the
names of blocks stored in the lost batches stay unknown here, so the router's index misses
them (a worse placement, never a wrong answer).
"""

from __future__ import annotations

import logging

import msgspec
import zmq
from vllm.distributed.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
)

from vllm_backend.cache_names import CacheNames
from vllm_backend.inbox import LoopReader
from workers.serve.kv_publisher import EventPublisher

log = logging.getLogger(__name__)
TOPIC = b"kv"
"""The topic the worker asks vLLM to publish under (:func:`vllm_backend.args.engine_kwargs`)."""


class EventFeed(LoopReader):
    """Lifecycle: construct (subscribes) -> :meth:`start` on the event loop -> :meth:`stop`."""

    def __init__(self, endpoint: str, names: CacheNames, publisher: EventPublisher) -> None:
        super().__init__(zmq.SUB, endpoint)
        self._socket.setsockopt(zmq.SUBSCRIBE, TOPIC)
        self.names = names
        self.publisher = publisher
        self.gaps = 0
        self._next_seq: int | None = None
        self._decoder = msgspec.msgpack.Decoder(KVEventBatch)

    def handle(self, frames: list[bytes]) -> None:
        try:
            self._apply(frames)
        except (msgspec.DecodeError, ValueError, TypeError) as exc:
            log.warning("dropped a malformed vLLM KV event batch: %s", exc)
        self.publisher.collect(self.names)

    def _apply(self, frames: list[bytes]) -> None:
        if len(frames) != 3:
            raise ValueError(f"{len(frames)} frames")
        seq = int.from_bytes(frames[1], "big")
        if self._next_seq is not None and seq != self._next_seq:
            self.gaps += 1
            log.warning("vLLM KV events %d..%d were lost", self._next_seq, seq - 1)
        self._next_seq = seq + 1
        for event in self._decoder.decode(frames[2]).events:
            if isinstance(event, BlockStored):
                self.names.stored(
                    event.block_hashes, event.parent_block_hash, event.token_ids, event.extra_keys
                )
            elif isinstance(event, BlockRemoved):
                self.names.removed(event.block_hashes)
            elif isinstance(event, AllBlocksCleared):
                self.names.cleared()
