"""``kvserve router``: the router process.

Lifecycle of :func:`serve`:

1. build the app from the three configs (validated by their own ``__post_init__``);
2. uvicorn binds ``router_host:router_port`` and runs the app's lifespan start (pool
   lookup client, registry watch); requests are served, over connections bounded in
   number and in how long they may take to send a request head or sit idle
   (:func:`server_config`);
3. SIGTERM or SIGINT: uvicorn stops accepting, gives in-flight requests up to
   :data:`GRACEFUL_S` to finish (streams still open then are cancelled, which aborts
   their requests on the workers), runs the lifespan end, and :func:`serve` returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from kvpool.config import PoolConfig
from proto.registry import ClusterConfig
from router.api.app import create_app
from router.config import RouterConfig

GRACEFUL_S = 10


class _Server(uvicorn.Server):
    """uvicorn's server, except that a SIGTERM/SIGINT ends :meth:`run` by returning.

    (uvicorn itself re-raises the captured signal after its graceful shutdown, so the
    process would die by it; a second signal still forces the exit.)
    """

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        signals = (signal.SIGINT, signal.SIGTERM)
        previous = {sig: signal.signal(sig, self._on_signal) for sig in signals}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _on_signal(self, sig: int, frame: FrameType | None) -> None:
        if self.should_exit:
            self.force_exit = True
        self.should_exit = True


class _BoundedH11(H11Protocol):
    """uvicorn's h11 protocol with a deadline on each request head and a hard connection cap.

    - Deadline: armed when the connection opens and again after each response, disarmed
      once h11 has parsed a request's line and headers; when it fires first, the connection
      is closed without an answer (there is no request to answer). uvicorn's keep-alive
      timer alone is no bound: it runs only after a response and stops at the first byte,
      so a client trickling its headers would hold the socket forever.
    - Cap: a connection accepted while ``limit_concurrency`` connections are open already
      is closed at once (uvicorn's own limit only answers 503 to complete requests, and so
      never frees a socket that sends no complete request).
    """

    head_timeout_s: float
    """Set by :func:`http_protocol` (``RouterConfig.header_timeout_s``)."""
    _head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if self.limit_concurrency is not None and len(self.connections) > self.limit_concurrency:
            transport.close()
            return
        self._arm_head_timer()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:  # the request head is in
            self._disarm_head_timer()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
            self._arm_head_timer()  # (a pipelined request may be parsed already)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_timer()
        super().connection_lost(exc)

    def _arm_head_timer(self) -> None:
        self._disarm_head_timer()
        self._head_timer = self.loop.call_later(self.head_timeout_s, self._head_timed_out)

    def _disarm_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.conn.their_state is h11.IDLE:
            self.timeout_keep_alive_handler()  # uvicorn's close of an idle connection


def http_protocol(header_timeout_s: float) -> type[H11Protocol]:
    """The router's HTTP protocol class (:class:`_BoundedH11`) with this head deadline."""

    class RouterHTTP(_BoundedH11):
        head_timeout_s = header_timeout_s

    return RouterHTTP


def server_config(app: Any, router: RouterConfig, **overrides: Any) -> uvicorn.Config:
    """uvicorn's settings for serving ``app`` as ``router`` says: its address, its bounds on
    connections (``max_connections``, ``header_timeout_s``, ``keep_alive_timeout_s``) and a
    graceful shutdown of :data:`GRACEFUL_S`; ``overrides`` replace any of them (tests: a
    port, a log level). Request bodies are bounded by the app (``max_body_bytes``) and
    request heads by h11 (16 KiB, else 400). The event loop is uvicorn's choice, uvloop's
    (``uvicorn[standard]`` brings it); the HTTP parser stays h11, not httptools, because
    :class:`_BoundedH11`'s deadline is written against h11's connection state."""
    settings: dict[str, Any] = {
        "host": router.router_host,
        "port": router.router_port,
        "http": http_protocol(router.header_timeout_s),
        "limit_concurrency": router.max_connections,
        "timeout_keep_alive": router.keep_alive_timeout_s,
        "timeout_graceful_shutdown": GRACEFUL_S,
        "log_level": "info",
        "access_log": False,
    }
    return uvicorn.Config(app, **{**settings, **overrides})


def serve(router: RouterConfig, cluster: ClusterConfig, pool: PoolConfig) -> None:
    """Serve the OpenAI-compatible API until SIGTERM/SIGINT, then return."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    _Server(server_config(create_app(router, cluster, pool), router)).run()
