"""Facts the connector inside vLLM's processes reports to the worker that serves the
requests: a one-way ZeroMQ channel (PUSH from each vLLM process, PULL in the worker, over
an ``ipc://`` socket in the worker's private directory).

vLLM hands a request's outputs back with how many prompt tokens were cached, not where
they came from, nor what the pool moved for it; our ``Worker`` contract reports both. So
the connector sends, as JSON objects with a kind ``k``:

- ``joined`` (worker side, when vLLM registered its caches): ``ok``, whether it joined
  the pool (a prefill or decode worker refuses to serve without);
- ``admit`` (scheduler side, when vLLM admits a request): ``rid``, the prompt tokens
  planned from the pool (``pool``). Sent before the step that computes the request runs,
  so before its first output exists;
- ``load`` (worker side, after the step that loaded it): ``rid``, the tokens that arrived
  verified (``tokens``), ``bytes``, ``seconds``, ``exposed`` (the part the step waited);
- ``write`` (worker side, after a step that wrote for it): ``rid``, ``bytes``, ``seconds``,
  ``exposed``;
- ``pool`` (worker side, at most every :data:`POOL_EVERY_S`): the pool's counters and
  health (:func:`pool_report`).

Lifecycle: the worker binds :class:`vllm_backend.inbox.ReportInbox` before it starts vLLM
and reads until it stops; each connector opens a :class:`Reporter` when vLLM builds it.
Sends never block: a report that cannot be queued is dropped (the worker then answers with
what it has: the facts are for accounting, never for correctness).
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from kvpool.pool import KVPool
from workers.core.engine_info import PoolHealth

if TYPE_CHECKING:
    import zmq

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
        self._dropped: tuple[type[Exception], ...] = ()
        self._noblock = 0
        if endpoint:
            import zmq  # vLLM's environment has it; a connector without a worker needs none

            socket = zmq.Context.instance().socket(zmq.PUSH)
            socket.setsockopt(zmq.SNDHWM, HIGH_WATER)
            socket.setsockopt(zmq.LINGER, 0)
            socket.connect(endpoint)
            self._socket, self._dropped, self._noblock = socket, (zmq.ZMQError,), zmq.NOBLOCK

    def send(self, kind: str, **fields: Any) -> None:
        """Queue one report (dropped if the queue is full or the socket closed)."""
        data = json.dumps({"k": kind, **fields}).encode()
        with self._lock, contextlib.suppress(*self._dropped):
            if self._socket is not None:
                self._socket.send(data, self._noblock)

    def close(self) -> None:
        with self._lock:
            if self._socket is not None:
                self._socket.close(0)
                self._socket = None


def pool_report(pool: KVPool, probe: bool = True) -> dict[str, Any]:
    """A pool's counters and health, as a ``pool`` report carries them (:class:`PoolHealth`
    and the byte and time counters of its :class:`~kvpool.stats.PoolStats`); ``probe``:
    as :meth:`PoolHealth.of`."""
    health = PoolHealth.of(pool, probe)
    stats = pool.stats
    return {
        "health": asdict(health),
        "bytes_read": stats.bytes_read,
        "bytes_written": stats.bytes_written,
        "read_seconds": stats.read_seconds,
        "write_seconds": stats.write_seconds,
    }
