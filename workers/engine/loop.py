"""The engine on its own thread, fed by the gRPC server's coroutines.

Lifecycle:

1. ``EngineLoop(engine).start()`` starts the thread; the engine is touched by no other
   thread from then on;
2. :meth:`EngineLoop.call` runs a function on the engine between two steps and returns a
   future of its result (reserve, abort, load reports, ...); :meth:`EngineLoop.start_request`
   also attaches a sink that receives every :class:`RequestOutput` of that request, from
   the step that produced it (one with ``error`` set if the engine failed on it alone,
   ``None`` if a whole step failed beyond that: the request is gone);
3. between calls the thread steps the engine while it has work, releases expired
   reservations and pool leases now and then, and sleeps on its queue when idle; after
   each round (calls, housekeeping, a step) it runs ``on_round(engine)`` if given (the KV
   event publisher's collection: :mod:`workers.serve.kv_publisher`; an exception is logged);
4. :meth:`EngineLoop.stop` ends the thread (pending calls fail with ``RuntimeError``).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, NamedTuple, TypeVar

from workers.core.engine_info import EngineInfo
from workers.core.outputs import RequestOutput
from workers.engine.engine import Engine

log = logging.getLogger(__name__)
T = TypeVar("T")
Sink = Callable[[RequestOutput | None], None]
HOUSEKEEPING_S = 0.25


class _Call(NamedTuple):
    """A function to run on the engine thread and the future of its result."""

    fn: Callable[[Engine], Any]
    future: Future[Any]


class EngineLoop:
    def __init__(self, engine: Engine, on_round: Callable[[Engine], None] | None = None) -> None:
        self.engine = engine
        """Owned by the thread once started: only :meth:`call` reaches it from outside."""
        self.info: EngineInfo = engine.info
        """The engine's fixed facts, readable from any thread."""
        self._calls: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._sinks: dict[str, Sink] = {}
        self._thread = threading.Thread(target=self._run, name="engine", daemon=True)
        self._stopping = False
        self._last_housekeeping = 0.0
        self._on_round = on_round

    def start(self) -> EngineLoop:
        self._thread.start()
        return self

    def call(self, fn: Callable[[Engine], T]) -> Future[T]:
        """Run ``fn(engine)`` on the engine thread; its result or exception in the future."""
        future: Future[T] = Future()
        if self._stopping:
            future.set_exception(RuntimeError("the engine is stopping"))
        else:
            self._calls.put(_Call(fn, future))
        return future

    def start_request(self, request_id: str, sink: Sink, fn: Callable[[Engine], T]) -> Future[T]:
        """Attach ``sink`` for ``request_id``'s outputs, then run ``fn`` (which adds the
        request); the sink is detached again if ``fn`` raises. ``ValueError`` (nothing
        attached, ``fn`` not run) while another request under that id is live: its outputs
        keep going to its own sink."""

        def run(engine: Engine) -> T:
            if request_id in self._sinks:
                raise ValueError(f"request id {request_id!r} is already in use")
            self._sinks[request_id] = sink
            try:
                return fn(engine)
            except BaseException:
                self._sinks.pop(request_id, None)
                raise

        return self.call(run)

    def detach(self, request_id: str) -> Sink | None:
        """Stop delivering outputs of ``request_id`` (call on the engine thread); its sink,
        if it had one."""
        return self._sinks.pop(request_id, None)

    def stop(self, timeout: float = 10.0) -> None:
        self._stopping = True
        self._calls.put(None)
        if self._thread.is_alive():
            self._thread.join(timeout)

    # -- the thread ---------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stopping:
            self._drain(block=not self.engine.has_unfinished)
            now = time.monotonic()
            if now - self._last_housekeeping >= HOUSEKEEPING_S:
                self._last_housekeeping = now
                self._housekeeping()
            if self.engine.has_unfinished and not self._stopping:
                self._step()
            if self._on_round is not None:
                self._round_done(self._on_round)
        self._fail_pending()

    def _round_done(self, on_round: Callable[[Engine], None]) -> None:
        try:
            on_round(self.engine)
        except Exception:  # observers never stop the engine
            log.exception("the engine loop's round hook failed")

    def _drain(self, block: bool) -> None:
        try:
            item = self._calls.get(timeout=HOUSEKEEPING_S) if block else self._calls.get_nowait()
        except queue.Empty:
            return
        while item is not None:
            fn, future = item
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(self.engine))
                except BaseException as exc:  # the caller gets it; the loop goes on
                    future.set_exception(exc)
            try:
                item = self._calls.get_nowait()
            except queue.Empty:
                return

    def _housekeeping(self) -> None:
        try:
            self.engine.housekeeping()
        except Exception:  # e.g. the pool is unreachable: the requests go on regardless
            log.exception("engine housekeeping failed; trying again later")

    def _step(self) -> None:
        try:
            outputs = self.engine.step()
        except Exception:
            log.exception("engine step failed; aborting the requests in flight")
            for request_id in list(self._sinks):
                self.engine.abort(request_id)
                self._sinks.pop(request_id)(None)
            return
        for out in outputs:
            sink = self._sinks.get(out.request_id)
            if sink is not None:
                if out.finished:
                    self._sinks.pop(out.request_id)
                sink(out)

    def _fail_pending(self) -> None:
        while True:
            try:
                item = self._calls.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                item.future.set_exception(RuntimeError("the engine stopped"))
        for sink in self._sinks.values():
            sink(None)
        self._sinks.clear()
