"""``kvserve router``: the router process.

Lifecycle of :func:`serve`:

1. build the app from the three configs (validated by their own ``__post_init__``);
2. uvicorn binds ``router_host:router_port`` and runs the app's lifespan start (pool
   lookup client, registry watch); requests are served;
3. SIGTERM or SIGINT: uvicorn stops accepting, gives in-flight requests up to
   :data:`GRACEFUL_S` to finish (streams still open then are cancelled, which aborts
   their requests on the workers), runs the lifespan end, and :func:`serve` returns.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Iterator
from types import FrameType

import uvicorn

from kvpool.config import PoolConfig
from proto.registry import ClusterConfig
from router.app import create_app
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


def serve(router: RouterConfig, cluster: ClusterConfig, pool: PoolConfig) -> None:
    """Serve the OpenAI-compatible API until SIGTERM/SIGINT, then return."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    app = create_app(router, cluster, pool)
    config = uvicorn.Config(
        app,
        host=router.router_host,
        port=router.router_port,
        log_level="info",
        timeout_graceful_shutdown=GRACEFUL_S,
        access_log=False,
    )
    _Server(config).run()
