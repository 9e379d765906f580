"""A real worker servicer (engine, engine thread, gRPC server) in the test process.

:func:`serving_worker` starts :class:`workers.serve.servicer.WorkerServicer` over a real
:class:`workers.engine.engine.Engine` on 127.0.0.1 (a free port, the cluster's server options, no
registry, a cluster secret of its own: every call goes through the token checks of
:mod:`proto.grpc_auth`), on an asyncio loop of its own thread, so a test can call it with a
blocking gRPC stub (the ``router`` identity: every verb) while also reaching into the engine
(through ``loop.call``) or patching it. Everything it started is stopped when the block ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc

from proto import channels, worker_pb2_grpc
from proto.grpc_auth import ROUTER
from proto.registry import ClusterConfig
from proto.trust import new_secret
from workers.config import EngineConfig
from workers.engine.engine import Engine
from workers.engine.loop import EngineLoop
from workers.serve.servicer import WorkerServicer

T = TypeVar("T")


@dataclass
class ServedWorker:
    address: str
    servicer: WorkerServicer
    loop: EngineLoop
    stub: worker_pb2_grpc.WorkerStub

    def on_engine(self, fn: Any, timeout: float = 30.0) -> Any:
        """``fn(engine)`` on the engine thread, between steps; its result."""
        return self.loop.call(fn).result(timeout)

    def idle(self) -> bool:
        """No request and no reservation left, and every page free."""

        def check(engine: Engine) -> bool:
            empty = not engine.has_unfinished and not engine.reservations
            return empty and engine.num_free_blocks == engine.num_blocks

        return bool(self.on_engine(check))


@contextlib.contextmanager
def serving_worker(config: EngineConfig, role: str = "mixed") -> Iterator[ServedWorker]:
    engine = Engine(config)
    loop = EngineLoop(engine).start()
    servicer = WorkerServicer(loop, role, lambda: None)
    aio = asyncio.new_event_loop()
    thread = threading.Thread(target=aio.run_forever, name="grpc-test", daemon=True)
    thread.start()

    def run(coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, aio).result(30)

    cluster = ClusterConfig(cluster_secret=new_secret())

    async def start() -> tuple[grpc.aio.Server, str]:
        bound: list[str] = []  # router tokens are addressed to the port it binds
        server = channels.server(cluster, lambda: bound[0])
        worker_pb2_grpc.add_WorkerServicer_to_server(servicer, server)
        bound.append(f"127.0.0.1:{channels.add_port(server, '127.0.0.1:0', cluster)}")
        await server.start()
        return server, bound[0]

    server, address = run(start())
    channel = channels.sync_channel(address, cluster, identity=ROUTER)
    try:
        yield ServedWorker(address, servicer, loop, worker_pb2_grpc.WorkerStub(channel))
    finally:
        run(server.stop(1.0))  # first: it ends every call still open on the channel
        channel.close()
        aio.call_soon_threadsafe(aio.stop)
        thread.join(10)
        aio.close()
        loop.stop()
        engine.close()
