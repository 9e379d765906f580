"""The router's live view of the workers, from the Redis registry.

Lifecycle of :class:`WorkerView`:

1. ``start()`` polls the registry once (so a router that starts next to a running
   cluster serves at once), then keeps polling every ``poll_s`` in a task;
2. each poll reads every record (``proto.registry.read_workers``, in a thread: redis-py's
   blocking client, from ``proto.registry.connect`` with the cluster's credentials; a
   refused or failed read is logged and the last view kept). Only records whose MAC
   verifies with the cluster secret, whose fields pass the schema and whose heartbeat is
   within ``heartbeat_ttl_s`` of this host's clock enter the view
   (:mod:`proto.record_store`); the others are logged, at most once a minute each
   (:class:`proto.registry.RejectLog`), and handed to ``on_reject`` (the router counts
   them), so a record forged, changed or put back from long ago in Redis routes nothing.
   It opens one ``grpc.aio`` channel + stub per new worker address, and a new one when
   another process serves at a known address (its ``started_at`` changed)
   (``proto.channels.channel``: TLS per the cluster's settings, and keepalive pings that
   fail every call to a frozen worker with UNAVAILABLE within about ``peer_timeout_s``);
   a flow whose call failed UNAVAILABLE asks
   :meth:`WorkerView.renewed` for a restarted worker's new channel at once, without waiting
   for the next poll (one poll runs at a time: :meth:`WorkerView.refresh`);
3. :meth:`live` gives the workers heard from within ``heartbeat_ttl_s``: in the registry,
   or, while the registry cannot be read, by answering ``GetLoad`` directly (so the router
   keeps serving through a Redis outage, and a worker that stops heartbeating and
   answering leaves routing within that time); a registry restarted empty is refilled by
   the workers' next heartbeats meanwhile;
4. a channel whose address has not been seen for ``channel_grace_s`` is closed (in-flight
   calls to a vanished worker get that long to end by themselves), and so is one replaced
   by a restarted worker's that long ago (a flow placed with it just before still calls
   an open channel);
5. ``stop()`` ends polling and closes every channel.

:class:`router.placement.live_worker.LiveWorker` is a worker of the view and its stub.
:meth:`WorkerView.hold` makes the router treat a worker as draining at once, before its
own report says so (the P:D controller is about to change its role), until a poll shows
the worker in its new role and not draining, the worker leaves the registry, or
:meth:`WorkerView.release`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import grpc
import redis
from google.protobuf.json_format import MessageToDict

from proto import channels
from proto import worker_pb2 as pb
from proto.registry import (
    ClusterConfig,
    RecordError,
    Rejection,
    RejectLog,
    WorkerRecord,
    connect,
    explain,
    read_workers,
)
from proto.worker_pb2_grpc import WorkerStub
from router.placement.live_worker import LiveWorker, record_draining, record_role

if TYPE_CHECKING:  # typing-only class of the generated stubs
    from proto.worker_pb2_grpc import WorkerAsyncStub

log = logging.getLogger(__name__)

POLL_S = 0.5
PROBE_TIMEOUT_S = 1.0
CHANNEL_GRACE_S = 60.0


@dataclass
class _Channel:
    channel: grpc.aio.Channel
    stub: WorkerAsyncStub
    seen_at: float
    started_at: float
    """The ``started_at`` of the worker process the channel was opened for."""


class WorkerView:
    def __init__(
        self,
        cluster: ClusterConfig,
        on_poll: Callable[[list[LiveWorker]], None] | None = None,
        poll_s: float = POLL_S,
        channel_grace_s: float = CHANNEL_GRACE_S,
        clock: Callable[[], float] = time.monotonic,
        on_reject: Callable[[Rejection], None] | None = None,
    ) -> None:
        self._cluster = cluster
        self._on_poll = on_poll
        self._on_reject = on_reject
        self._keys = cluster.keys
        self._rejects = RejectLog(log, "registry value")
        self._poll_s = poll_s
        self._grace_s = channel_grace_s
        self._clock = clock
        self._redis: redis.Redis = connect(
            cluster, socket_timeout=cluster.heartbeat_ttl_s, socket_connect_timeout=1.0
        )
        self._channels: dict[str, _Channel] = {}
        self._retired: list[tuple[float, grpc.aio.Channel]] = []
        """Channels replaced by a restarted worker's, with when: closed after the grace."""
        self._seen: dict[str, tuple[float, WorkerRecord]] = {}
        self._holds: dict[str, str] = {}  # worker id -> the role that ends its hold
        self._task: asyncio.Task[None] | None = None
        self._polling: asyncio.Future[None] | None = None

    async def start(self) -> None:
        await self.poll_once()
        self._task = asyncio.create_task(self._run(), name="worker-view")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._polling is not None:
            self._polling.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._polling
        for entry in self._channels.values():
            await entry.channel.close(None)
        for _, channel in self._retired:
            await channel.close(None)
        self._channels.clear()
        self._retired.clear()
        self._seen.clear()
        self._redis.close()

    def live(self) -> list[LiveWorker]:
        """Workers heard from within ``heartbeat_ttl_s``, sorted by worker id."""
        horizon = self._clock() - self._cluster.heartbeat_ttl_s
        out: list[LiveWorker] = []
        for seen_at, record in sorted(self._seen.values(), key=lambda x: x[1].worker_id):
            entry = self._channels.get(record.address)
            if seen_at >= horizon and entry is not None:
                out.append(LiveWorker(record, entry.stub, record.worker_id in self._holds))
        return out

    def get(self, worker_id: str) -> LiveWorker | None:
        return next((w for w in self.live() if w.worker_id == worker_id), None)

    def hold(self, worker_id: str, until_role: str) -> None:
        """Treat ``worker_id`` as draining from now until a poll shows it in ``until_role``
        and not draining, it leaves the registry, or :meth:`release`."""
        self._holds[worker_id] = until_role

    def release(self, worker_id: str) -> None:
        self._holds.pop(worker_id, None)

    async def refresh(self) -> None:
        """:meth:`poll_once` now, or wait for the one under way: one poll at a time, however
        many callers (the polling task, and flows asking for :meth:`renewed`). A poll that
        fails is logged, not raised."""
        if self._polling is None or self._polling.done():
            self._polling = asyncio.ensure_future(self._poll_logged())
        await asyncio.shield(self._polling)

    async def renewed(self, worker: LiveWorker) -> LiveWorker | None:
        """``worker``'s successor: after a :meth:`refresh`, the live worker of the same id
        when another process serves it now (its ``started_at`` changed: it was restarted,
        and calls through the old channel failed while this view had not caught up); None
        when the same process, or nobody, serves it."""
        await self.refresh()
        now = self.get(worker.worker_id)
        if now is None or now.record.started_at == worker.record.started_at:
            return None
        return now

    async def _poll_logged(self) -> None:
        try:
            await self.poll_once()
        except Exception:  # keep the view whatever one poll hit
            log.exception("worker registry poll failed")

    async def poll_once(self) -> None:
        """Read the registry and refresh the view (callers other than :meth:`start` use
        :meth:`refresh`, which runs one poll at a time).

        A worker missing from a readable registry stays in the view until its last
        sighting is ``heartbeat_ttl_s`` old (a Redis restarted empty is refilled by the
        next heartbeats). When the registry cannot be read, the known workers are asked
        directly (``GetLoad``): those that answer stay, with their fresh load; the others
        drop out once unheard for ``heartbeat_ttl_s``.
        """
        try:
            listing = await asyncio.to_thread(
                read_workers, self._redis, self._keys, self._cluster.heartbeat_ttl_s
            )
        except redis.RedisError as exc:
            log.warning("worker registry unreadable: %s", explain(self._cluster, exc))
            records = await self._probe_known()
        else:
            records = listing.records
            self._rejects.note(listing.rejected)
            if self._on_reject is not None:
                for rejection in listing.rejected:
                    self._on_reject(rejection)
        now = self._clock()
        horizon = now - self._cluster.heartbeat_ttl_s
        seen = {k: v for k, v in self._seen.items() if v[0] >= horizon}
        seen.update({r.worker_id: (now, r) for r in records})
        self._seen = seen
        for r in records:
            await self._channel(r, now)
        self._end_holds()
        await self._close_stale(now)
        if self._on_poll is not None:
            self._on_poll(self.live())

    async def _probe_known(self) -> list[WorkerRecord]:
        """The known workers that answer ``GetLoad`` now, with that load in their record."""
        known = [(r, self._channels.get(r.address)) for _, r in self._seen.values()]
        asked = [(r, e) for r, e in known if e is not None]
        timeout = min(PROBE_TIMEOUT_S, self._cluster.heartbeat_ttl_s)
        replies = await asyncio.gather(
            *(e.stub.GetLoad(pb.LoadRequest(), timeout=timeout) for _, e in asked),
            return_exceptions=True,
        )
        answered = [
            _with_load(r, reply)
            for (r, _), reply in zip(asked, replies, strict=True)
            if isinstance(reply, pb.LoadReport)
        ]
        return [r for r in answered if r is not None]

    def _end_holds(self) -> None:
        for worker_id, role in list(self._holds.items()):
            seen = self._seen.get(worker_id)
            if seen is None or (record_role(seen[1]) == role and not record_draining(seen[1])):
                del self._holds[worker_id]

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._poll_s)
            await self.refresh()

    async def _channel(self, record: WorkerRecord, now: float) -> None:
        """Open a channel to ``record``'s address, or a new one when a new process serves
        there (a restarted worker): the old channel may still be backing off from the
        process that died, failing every call at once with UNAVAILABLE for up to a second."""
        entry = self._channels.get(record.address)
        if entry is not None and entry.started_at != record.started_at:
            self._retired.append((now, entry.channel))  # flows placed before may still call
            entry = None
        if entry is None:
            channel = channels.channel(record.address, self._cluster)
            entry = _Channel(channel, WorkerStub(channel), now, record.started_at)
            self._channels[record.address] = entry
        entry.seen_at = now

    async def _close_stale(self, now: float) -> None:
        """Close the channels of addresses unseen for ``channel_grace_s``, and the channels
        replaced that long ago: a flow placed with the old stub just before the new process
        was seen gets UNAVAILABLE from it (or reaches the new process at the same address),
        never a closed channel."""
        stale = [a for a, e in self._channels.items() if now - e.seen_at > self._grace_s]
        for address in stale:
            await self._channels.pop(address).channel.close(None)
        keep = [(t, c) for t, c in self._retired if now - t <= self._grace_s]
        for t, channel in self._retired:
            if now - t > self._grace_s:
                await channel.close(None)
        self._retired = keep


def _with_load(record: WorkerRecord, report: pb.LoadReport) -> WorkerRecord | None:
    """``record`` with ``report`` as its load, or None if the schema refuses the report."""
    try:
        load = MessageToDict(report, preserving_proto_field_name=True)
        return dataclasses.replace(record, load=load)
    except RecordError as exc:
        log.warning("worker %s: load report refused: %s", record.worker_id, exc)
        return None
