"""This worker's KV events, published to the cluster's stream.

The engine's :class:`~workers.core.block_pool.BlockPool` logs a :class:`proto.kv_events.Stored`
or :class:`~proto.kv_events.Removed` event for every change of its prefix-cache index; this
module ships them to the router's index (:mod:`router.placement.prefix_index`) through Redis
(:mod:`proto.kv_stream`), off the engine thread.

Lifecycle of :class:`EventPublisher`:

1. ``EventPublisher(cluster, worker_id, incarnation)``: ``incarnation`` is the worker
   record's ``started_at``, so a restarted process is told apart from its predecessor;
2. :meth:`attach` (on the engine thread, once) turns the pool's event log on and asks for
   a snapshot: an incarnation's first batch lists what its cache holds (the warm-up's
   blocks, or nothing);
3. :meth:`collect` runs on the engine thread after each round of work (the engine loop's
   ``on_round``): the events since the last call become one queued delta, and when a
   snapshot is wanted, the cache's names follow as a snapshot (both in engine order). It
   never blocks: with the queue full (Redis slow or down) the delta is dropped, the next
   batch's seq skips one (readers see the gap) and a snapshot is wanted;
4. :meth:`start` runs the sending thread: each queued item gets the next seqs (a snapshot
   split into parts of :data:`proto.kv_events.MAX_EVENTS`, a long delta into several
   deltas) and is added to the stream; every :data:`POLL_S` it also checks whether a
   reader asked for a snapshot (:func:`proto.kv_stream.take_snapshot_request`; honoured at
   most every :data:`SNAPSHOT_EVERY_S`). A batch Redis refuses keeps its seq (a gap for
   readers); what is queued behind it is dropped (one more seq skipped) and the next
   item is a snapshot, so a Redis outage costs one failed call, not one per queued item;
5. :meth:`stop` ends the thread after the item it is sending (what is still queued is
   not sent: the worker is leaving, and the router forgets it when its record goes).
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from typing import NamedTuple, Protocol

import redis

from proto.kv_events import MAX_EVENTS, EventBatch, KVEvent, Stored
from proto.kv_stream import publish_batch, take_snapshot_request
from proto.registry import ClusterConfig, connect

log = logging.getLogger(__name__)

POLL_S = 0.5
"""How often the sending thread checks for a reader's snapshot request."""
SNAPSHOT_EVERY_S = 2.0
"""Least time between two snapshots made on readers' requests (each may be megabytes)."""
MAX_QUEUED = 512
"""Items waiting to be sent; beyond that the engine drops deltas (see the docstring)."""
LOG_EVERY_S = 60.0


class EventSource(Protocol):
    """A cache whose changes are published: our engine's
    :class:`~workers.core.block_pool.BlockPool`, or vLLM's under our names
    (``vllm_backend.cache_names.CacheNames``)."""

    def log_events(self) -> None:
        """Log events from now on."""

    def take_events(self) -> list[KVEvent]:
        """The events since the last call, oldest first."""
        ...

    def cached_names(self) -> list[int]:
        """Every block name the cache holds now."""
        ...


class _Item(NamedTuple):
    """Events in engine order: a delta, or a snapshot's names (``snapshot``)."""

    events: list[KVEvent]
    snapshot: bool


class EventPublisher:
    """One worker process's KV event stream (module docstring)."""

    def __init__(self, cluster: ClusterConfig, worker_id: str, incarnation: float) -> None:
        self._keys = cluster.keys
        self._worker_id = worker_id
        self._incarnation = incarnation
        self._client = connect(cluster, socket_timeout=cluster.heartbeat_s,
                               socket_connect_timeout=1.0)  # fmt: skip
        self._queue: queue.Queue[_Item | None] = queue.Queue(MAX_QUEUED)
        self._want_snapshot = threading.Event()
        self._skip = threading.Event()
        self._stopping = threading.Event()
        self._seq = 0
        self._last_requested = 0.0
        self._next_poll = 0.0
        self._quiet_until = 0.0
        self._thread = threading.Thread(target=self._run, name="kv-events", daemon=True)
        self.published = 0
        """Batches added to the stream so far."""
        self.failed = 0
        """Batches Redis refused, or items dropped for a full queue."""

    # --- the engine thread --------------------------------------------------------------

    def attach(self, pool: EventSource) -> None:
        """Log ``pool``'s events from now on; the first batch is a snapshot."""
        pool.log_events()
        self._want_snapshot.set()

    def collect(self, pool: EventSource) -> None:
        """Queue the events ``pool`` logged since the last call, then a snapshot if one is
        wanted. Never blocks, never raises for a full queue."""
        events = pool.take_events()
        if events and not self._offer(_Item(events, False)):
            return
        if self._want_snapshot.is_set():
            snapshot = _Item([Stored(h, 0) for h in pool.cached_names()], True)
            if self._offer(snapshot):
                self._want_snapshot.clear()

    def _offer(self, item: _Item) -> bool:
        try:
            self._queue.put_nowait(item)
            return True
        except queue.Full:
            self.failed += 1
            self._skip.set()
            self._want_snapshot.set()
            return False

    # --- the sending thread -------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        """End the thread (waiting at most ``timeout`` seconds) and close the client."""
        self._stopping.set()
        if self._thread.is_alive():
            with contextlib.suppress(queue.Full):
                self._queue.put_nowait(None)  # wakes the thread at once
            self._thread.join(timeout)
        self._client.close()

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                item = self._queue.get(timeout=POLL_S)
            except queue.Empty:
                item = _Item([], False)
            if item is None or self._stopping.is_set():
                return
            if item.events or item.snapshot:
                self._send(item)
            self._check_requests()

    def _send(self, item: _Item) -> None:
        if self._skip.is_set():
            self._skip.clear()
            self._seq += 1  # the dropped delta's seq: readers see a gap
        chunks = [item.events[i : i + MAX_EVENTS] for i in range(0, len(item.events), MAX_EVENTS)]
        for part, chunk in enumerate(chunks or [[]]):
            batch = EventBatch(
                worker_id=self._worker_id,
                incarnation=self._incarnation,
                seq=self._seq,
                events=tuple(chunk),
                snapshot=item.snapshot,
                part=part if item.snapshot else 0,
                final=part == len(chunks) - 1 or not chunks or not item.snapshot,
            )
            self._seq += 1
            try:
                publish_batch(self._client, self._keys, batch)
                self.published += 1
            except (redis.RedisError, OSError) as exc:
                self.failed += 1
                self._discard_queued()
                self._want_snapshot.set()
                self._warn(f"KV events not published ({exc}); a snapshot follows")
                return

    def _discard_queued(self) -> None:
        """Drop every queued item (a snapshot will supersede them); the next batch skips a
        seq if anything was dropped."""
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if item is None:
                self._stopping.set()
                return
            self.failed += 1
            self._skip.set()

    def _check_requests(self) -> None:
        now = time.monotonic()
        if now < self._next_poll or now - self._last_requested < SNAPSHOT_EVERY_S:
            return
        self._next_poll = now + POLL_S
        try:
            requested = take_snapshot_request(self._client, self._keys, self._worker_id)
        except (redis.RedisError, OSError) as exc:
            self._warn(f"snapshot requests unreadable ({exc})")
            return
        if requested:
            self._last_requested = now
            self._want_snapshot.set()

    def _warn(self, message: str) -> None:
        now = time.monotonic()
        if now >= self._quiet_until:
            self._quiet_until = now + LOG_EVERY_S
            log.warning("%s (%d batches failed so far)", message, self.failed)
