"""Facts the connector inside vLLM's processes reports to the worker that serves the
requests: a one-way ZeroMQ channel (PUSH from each vLLM process, PULL in the worker, over
an ``ipc://`` socket in the worker's private directory).

vLLM hands a request's outputs back with how many prompt tokens were cached, not where
they came from, nor what the pool moved for it; our ``Worker`` contract reports both. So
the connector sends, as JSON objects with a kind ``k``:

- ``admit`` (scheduler side, when vLLM admits a request): ``rid``, the prompt tokens
  planned from the pool (``pool``). Sent before the step that computes the request runs,
  so before its first output exists;
- ``load`` (worker side, after the step that loaded it): ``rid``, the tokens that arrived
  verified (``tokens``), ``bytes``, ``seconds``, ``exposed`` (the part the step waited);
- ``write`` (worker side, after a step that wrote for it): ``rid``, ``bytes``, ``seconds``,
  ``exposed``;
- ``pool`` (worker side, at most every :data:`POOL_EVERY_S`): the pool's counters and
  health (:func:`pool_report`).

Lifecycle: the worker binds :class:`ReportInbox` before it starts vLLM and reads until it
stops; each connector opens a :class:`Reporter` when vLLM builds it. Sends never block: a
report that cannot be queued is dropped (the worker then answers with what it has: the
facts are for accounting, never for correctness).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import zmq
import zmq.asyncio

from kvpool.pool import KVPool
from workers.engine_info import PoolHealth

log = logging.getLogger(__name__)
POOL_EVERY_S = 1.0
"""Least time between two ``pool`` reports of one connector."""
HIGH_WATER = 10_000
"""Reports queued per socket before new ones are dropped."""


class Reporter:
    """The sending end (in a connector); ``endpoint`` '' sends nothing. Threads may share
    it (a ZeroMQ socket may not: sends take a lock)."""

    def __init__(self, endpoint: str) -> None:
        self._lock = threading.Lock()
        self._socket: zmq.Socket[bytes] | None = None
        if endpoint:
            socket = zmq.Context.instance().socket(zmq.PUSH)
            socket.setsockopt(zmq.SNDHWM, HIGH_WATER)
            socket.setsockopt(zmq.LINGER, 0)
            socket.connect(endpoint)
            self._socket = socket

    def send(self, kind: str, **fields: Any) -> None:
        """Queue one report (dropped if the queue is full or the socket closed)."""
        data = json.dumps({"k": kind, **fields}).encode()
        with self._lock, contextlib.suppress(zmq.ZMQError):
            if self._socket is not None:
                self._socket.send(data, zmq.NOBLOCK)

    def close(self) -> None:
        with self._lock:
            if self._socket is not None:
                self._socket.close(0)
                self._socket = None


def pool_report(pool: KVPool) -> dict[str, Any]:
    """A pool's counters and health, as a ``pool`` report carries them (:class:`PoolHealth`
    and the byte and time counters of its :class:`~kvpool.stats.PoolStats`)."""
    health = PoolHealth.of(pool)
    stats = pool.stats
    return {
        "health": asdict(health),
        "bytes_read": stats.bytes_read,
        "bytes_written": stats.bytes_written,
        "read_seconds": stats.read_seconds,
        "write_seconds": stats.write_seconds,
    }


class LoopReader:
    """A ZeroMQ socket (``kind``: ``zmq.PULL`` bound, ``zmq.SUB`` connected) read on the
    event loop: each message's frames go to :meth:`handle`. Lifecycle: construct -> start
    (on the event loop) -> stop."""

    def __init__(self, kind: int, endpoint: str) -> None:
        self._context = zmq.asyncio.Context()
        self._socket = self._context.socket(kind)
        self._socket.setsockopt(zmq.RCVHWM, HIGH_WATER)
        self._socket.setsockopt(zmq.LINGER, 0)
        if kind == zmq.SUB:
            self._socket.connect(endpoint)  # before the publisher binds: fine for ipc://
        else:
            self._socket.bind(endpoint)
        self._task: asyncio.Task[None] | None = None

    def handle(self, frames: list[bytes]) -> None:
        raise NotImplementedError

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            self.handle(await self._socket.recv_multipart())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._socket.close(0)
        self._context.term()


class ReportInbox(LoopReader):
    """The receiving end (in the worker): binds ``endpoint`` and hands every report to
    ``handle_report`` on the event loop. Malformed messages are logged and skipped."""

    def __init__(self, endpoint: str, handle_report: Callable[[dict[str, Any]], None]) -> None:
        super().__init__(zmq.PULL, endpoint)
        self.endpoint = endpoint
        self._handle_report = handle_report

    def handle(self, frames: list[bytes]) -> None:
        try:
            report = json.loads(frames[-1])
            if not isinstance(report, dict):
                raise ValueError("not an object")
            self._handle_report(report)
        except (ValueError, TypeError, KeyError) as exc:
            log.warning("dropped a malformed connector report: %s", exc)
