"""The router's per-worker prefix index, kept current from the workers' KV events.

Lifecycle of :class:`KVIndex`:

1. ``KVIndex(cluster, on_batches, on_rejected)``; :meth:`start` (on the event loop) notes
   the stream's last entry id, then reads on from there in a daemon thread: blocking XREADs
   (:func:`proto.kv_stream.read_batches`, a connection of its own), each answer's decoded
   batches handed to the event loop, which applies them (:meth:`apply`). Entries that do
   not decode (forged, malformed, oversize) are counted through ``on_rejected`` and
   skipped; a Redis failure is logged (at most every :data:`LOG_EVERY_S`) and the read
   retried after :data:`RETRY_S` from the same entry;
2. every registry poll calls :meth:`sync` with the live workers: a worker that left is
   forgotten, and one whose cache the index does not know (never heard of since this
   router started, or events missed: a seq gap) is asked for a snapshot
   (:func:`proto.kv_stream.request_snapshot`, in a thread; again after
   :data:`ASK_AGAIN_S` while it is still unknown). So a router that starts late, or loses
   events, catches up within a snapshot;
3. :meth:`apply` (event loop) applies only the batches of workers in the view, and not
   those of an incarnation older than the one the registry shows;
4. :meth:`local_tokens` answers, for one prompt's chain, the leading prompt tokens each
   known worker's local cache holds (:meth:`router.placement.prefix_index.PrefixIndex.matched_all`),
   continued by what this router's own placements (:meth:`placed`) expect it to hold
   before its events say so (:class:`router.placement.expected_blocks.ExpectedBlocks`; every
   applied batch confirms or denies those expectations);
5. :meth:`stop` ends the thread (within one XREAD block) and closes its connections.

Several routers read the same stream and apply the same batches, so their indexes agree up
to what each has read. The index is a hint: a wrong answer costs a worse placement, never
a wrong result (the worker checks its own cache).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Sequence

import redis

from proto.kv_events import EventBatch
from proto.kv_stream import read_batches, request_snapshot, stream_name
from proto.refusals import Rejection
from proto.registry import ClusterConfig, connect
from router.placement.expected_blocks import ExpectedBlocks
from router.placement.live_worker import LiveWorker
from router.placement.prefix_index import Outcome, PrefixIndex

log = logging.getLogger(__name__)

BLOCK_MS = 1000
"""How long one XREAD waits for new entries (and how long :meth:`KVIndex.stop` may take)."""
RETRY_S = 1.0
ASK_AGAIN_S = 5.0
"""Least time between two snapshot requests to one worker."""
LOG_EVERY_S = 60.0


class KVIndex:
    """The index and its reader (module docstring). ``on_outcome`` gets the outcome of
    each applied batch, ``on_rejected`` each refused stream entry (metrics)."""

    def __init__(
        self,
        cluster: ClusterConfig,
        on_outcome: Callable[[Outcome], None] = lambda _: None,
        on_rejected: Callable[[Rejection], None] = lambda _: None,
    ) -> None:
        self.index = PrefixIndex()
        self.expected = ExpectedBlocks()
        self._cluster = cluster
        self._on_outcome = on_outcome
        self._on_rejected = on_rejected
        self._incarnations: dict[str, float] = {}
        self._asked: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._client = connect(cluster, socket_timeout=BLOCK_MS / 1000 + cluster.heartbeat_s,
                               socket_connect_timeout=1.0)  # fmt: skip
        self._asker = connect(cluster, socket_timeout=cluster.heartbeat_s,
                              socket_connect_timeout=1.0)  # fmt: skip
        self._quiet_until = 0.0

    # --- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        """Start reading after the stream's current last entry (none: from the start)."""
        loop = asyncio.get_running_loop()
        try:
            after = await asyncio.to_thread(self._last_id)
        except (redis.RedisError, OSError) as exc:
            self._warn(f"KV event stream unreadable ({exc}); reading from its start")
            after = b"0-0"
        self._thread = threading.Thread(
            target=self._read, args=(loop, after), name="kv-events", daemon=True
        )
        self._thread.start()

    async def stop(self) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None:
            await asyncio.to_thread(thread.join, BLOCK_MS / 1000 + RETRY_S + 1.0)
        self._client.close()
        self._asker.close()

    def _last_id(self) -> bytes:
        newest = self._client.xrevrange(stream_name(self._cluster.keys), count=1)
        if not newest:
            return b"0-0"
        entry_id = newest[0][0]
        return entry_id if isinstance(entry_id, bytes) else str(entry_id).encode()

    # --- the reading thread -------------------------------------------------------------

    def _read(self, loop: asyncio.AbstractEventLoop, after: bytes) -> None:
        keys = self._cluster.keys
        while not self._stop.is_set():
            try:
                reading = read_batches(self._client, keys, after, block_ms=BLOCK_MS)
            except (redis.RedisError, OSError) as exc:
                self._warn(f"KV events unreadable ({exc}); retrying")
                self._stop.wait(RETRY_S)
                continue
            after = reading.last_id
            if reading.batches or reading.rejected:
                batches = [batch for _, batch in reading.batches]
                try:
                    loop.call_soon_threadsafe(self._deliver, batches, reading.rejected)
                except RuntimeError:  # the event loop closed: the router is stopping
                    return

    def _deliver(self, batches: list[EventBatch], rejected: list[Rejection]) -> None:
        for rejection in rejected:
            self._on_rejected(rejection)
        for batch in batches:
            self.apply(batch)

    # --- the event loop -----------------------------------------------------------------

    def apply(self, batch: EventBatch) -> Outcome | None:
        """Apply ``batch`` if its worker is in the view and not older than its record
        there; the outcome, or None when it was not applied."""
        known = self._incarnations.get(batch.worker_id)
        if known is None or batch.incarnation < known:
            return None
        outcome = self.index.apply(batch)
        self.expected.observe(batch)
        self._on_outcome(outcome)
        return outcome

    def sync(self, live: Sequence[LiveWorker]) -> None:
        """Follow the view: forget workers that left, ask unknown ones for snapshots."""
        now = time.monotonic()
        current = {w.worker_id: w.record.started_at for w in live}
        for worker_id in set(self._incarnations) - set(current):
            self.index.forget(worker_id)
            self.expected.forget(worker_id)
            self._asked.pop(worker_id, None)
        self._incarnations = current
        for worker_id, started_at in current.items():
            position = self.index.position(worker_id)
            known = position is not None and position[0] >= started_at
            if known and self.index.synced(worker_id):
                continue
            if now - self._asked.get(worker_id, -ASK_AGAIN_S) >= ASK_AGAIN_S:
                self._asked[worker_id] = now
                asyncio.get_running_loop().run_in_executor(None, self._ask, worker_id)

    def _ask(self, worker_id: str) -> None:
        try:
            request_snapshot(self._asker, self._cluster.keys, worker_id, ASK_AGAIN_S * 2)
        except (redis.RedisError, OSError) as exc:
            self._warn(f"cannot ask {worker_id} for a KV snapshot ({exc})")

    def local_tokens(self, chain: Sequence[int], block_tokens: int) -> dict[str, int]:
        """Leading prompt tokens the local cache of each worker holds (of a prompt whose
        usable block names are ``chain``): for a worker whose cache the index knows, its
        match continued by what it is expected to hold; for another, only what it is
        expected to hold; workers with neither are left out (no prediction)."""
        matched = self.index.matched_all(chain)
        known = {w: n for w, n in matched.items() if self.index.synced(w)}
        extended = self.expected.extend(known, chain, time.monotonic())
        return {w: n * block_tokens for w, n in extended.items()}

    def placed(self, worker_ids: Sequence[str], chain: Sequence[int]) -> None:
        """This router placed a prompt whose usable block names are ``chain`` on
        ``worker_ids`` (they will cache it)."""
        self.expected.placed(worker_ids, chain, time.monotonic())

    def _warn(self, message: str) -> None:
        now = time.monotonic()
        if now >= self._quiet_until:
            self._quiet_until = now + LOG_EVERY_S
            log.warning("%s", message)
