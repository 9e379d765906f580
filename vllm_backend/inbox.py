"""The worker's ends of its ZeroMQ sockets to vLLM, read on its event loop:
:class:`ReportInbox` (the connector's reports, :mod:`vllm_backend.reports`) and the base
:class:`LoopReader` that :class:`vllm_backend.event_feed.EventFeed` (vLLM's KV events)
shares."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from typing import Any

import zmq
import zmq.asyncio

from vllm_backend.reports import HIGH_WATER

log = logging.getLogger(__name__)


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
