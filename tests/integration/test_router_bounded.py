"""No client can make the router do unbounded work, through real sockets and stub workers:
connections are capped (503 at the cap, closed at once beyond it), each request head must
arrive within ``header_timeout_s`` (also after a keep-alive response), tokenizing leaves the
event loop free, and a pool master that never answers costs a request no more than
``pool_lookup_timeout_s`` and its pool hits.

The harness (:mod:`tests.integration.router_harness`) serves its app with uvicorn's plain
settings; :func:`bounded` serves the same app again, on a port of its own, with the router's
own (:func:`router.main.server_config`, lifespan off: the harness's server ran it).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import http.client
import json
import select
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from kvpool.net import free_local_ports
from router.main import server_config
from router.service import RouterService
from tests.integration.router_harness import MODEL, Harness, StubWorker, running_redis
from tests.unit.test_router_bounded import FrozenStore

CAP = 4
PATH = "/v1/models"  # 200 from the app whatever its state: a 503 is uvicorn's cap
REQUEST = f"GET {PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()
HEAD = REQUEST[:-2] + b"X-Slow: "  # a head whose last header never ends
CLOSE_BOUND_S = 15.0  # generous: the server should close within header_timeout_s (1-6 s)


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory, default_model_dir: Path) -> Iterator[Harness]:
    with (
        running_redis(tmp_path_factory.mktemp("redis")) as url,
        Harness(url, default_model_dir, [StubWorker("d1", "decode")]) as h,
    ):
        yield h


@contextmanager
def bounded(h: Harness, **bounds: Any) -> Iterator[tuple[int, uvicorn.Server]]:
    """``h``'s app served with the router's uvicorn settings, its config's fields replaced by
    ``bounds``; yields the port and the server, stopped on exit."""
    (port,) = free_local_ports(1)
    router = dataclasses.replace(h.config, router_port=port, **bounds)
    server = uvicorn.Server(server_config(h.app, router, log_level="warning", lifespan="off"))
    done = asyncio.run_coroutine_threadsafe(server.serve(), h.loop)
    try:
        deadline = time.monotonic() + 10
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.02)
        assert server.started
        yield port, server
    finally:
        server.should_exit = True
        done.result(30)


def get_status(port: int) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", PATH)
        return conn.getresponse().status
    finally:
        conn.close()


def slow_client(port: int) -> socket.socket:
    """A connection that has sent part of a request head and sends the rest never."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(HEAD)
    return sock


def closed_by_server(sock: socket.socket, wait_s: float) -> bool:
    """True once the server has closed ``sock`` (EOF or reset), within ``wait_s``."""
    if not select.select([sock], [], [], wait_s)[0]:
        return False
    try:
        return sock.recv(1024) == b""
    except ConnectionError:
        return True


def trickle_until_closed(socks: list[socket.socket], bound_s: float) -> list[socket.socket]:
    """Send one more header byte on each socket every 0.1 s until the server has closed them
    all or ``bound_s`` passed; the sockets it left open."""
    deadline, open_ = time.monotonic() + bound_s, list(socks)
    while open_ and time.monotonic() < deadline:
        for sock in list(open_):
            if closed_by_server(sock, 0.0):
                open_.remove(sock)
                continue
            try:
                sock.sendall(b"a")
            except OSError:
                open_.remove(sock)
        time.sleep(0.1)
    return open_


def settle(server: uvicorn.Server, connections: int) -> None:
    """Wait until the server holds ``connections`` connections (it accepts and closes them
    on its own loop)."""
    deadline = time.monotonic() + 5
    while len(server.server_state.connections) != connections and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(server.server_state.connections) == connections


def test_slow_header_clients_are_capped_and_cut_off(harness: Harness) -> None:
    # the slow clients must stay held through the checks before the trickle, however loaded
    # the machine: a 2 s timeout cut them off before the first check in a loaded suite run
    with bounded(harness, max_connections=CAP, header_timeout_s=6.0) as (port, server):
        slow = [slow_client(port) for _ in range(CAP - 1)]
        try:
            settle(server, CAP - 1)
            assert get_status(port) == 503  # its own connection reaches the cap
            settle(server, CAP - 1)
            slow.append(slow_client(port))
            settle(server, CAP)
            with socket.create_connection(("127.0.0.1", port), timeout=10) as extra:
                with contextlib.suppress(ConnectionError):  # (it may be closed already)
                    extra.sendall(REQUEST)
                assert closed_by_server(extra, CLOSE_BOUND_S)  # beyond the cap: no answer
            assert trickle_until_closed(slow, CLOSE_BOUND_S) == []
            assert get_status(port) == 200  # slots free again
        finally:
            for sock in slow:
                sock.close()


def test_a_kept_alive_connection_must_send_its_next_head_in_time(harness: Harness) -> None:
    with (
        bounded(harness, header_timeout_s=1.0) as (port, _),
        socket.create_connection(("127.0.0.1", port), timeout=10) as sock,
    ):
        sock.sendall(REQUEST)
        assert sock.recv(4096).startswith(b"HTTP/1.1 200")
        sock.sendall(HEAD)  # then the next request's head, byte by byte
        assert trickle_until_closed([sock], CLOSE_BOUND_S) == []


def _service(h: Harness) -> RouterService:
    assert h.app is not None
    service: RouterService = h.app.state.service
    return service


@pytest.mark.parametrize("method", ["encode", "encode_chat"])
def test_a_long_tokenization_leaves_the_loop_free(
    harness: Harness, monkeypatch: pytest.MonkeyPatch, method: str
) -> None:
    service = _service(harness)
    tok = asyncio.run_coroutine_threadsafe(service.tokenizer(), harness.loop).result(60)
    started, release = threading.Event(), threading.Event()
    real = getattr(tok, method)

    def slow(prompt: Any) -> list[int]:  # as long as the test wants; longer than /health waits
        started.set()
        release.wait(30)
        return list(real(prompt))

    monkeypatch.setattr(tok, method, slow)
    client = harness.client()

    def ask() -> int:
        """Choices in the answer to a completion that tokenizes with ``method``."""
        if method == "encode":
            return len(client.completions.create(model=MODEL, prompt="hi", max_tokens=2).choices)
        messages: Any = [{"role": "user", "content": "hi"}]
        chat = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2)
        return len(chat.choices)

    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(ask)
        assert started.wait(20)
        try:
            health = harness.get("/health")  # answered while the tokenizer still works
        finally:
            release.set()
        assert health[0] == 200
        assert answer.result(30) == 1


def test_a_frozen_pool_master_costs_a_request_only_its_hits(harness: Harness) -> None:
    service, frozen = _service(harness), FrozenStore()
    service.pool._store = frozen.as_store()
    try:
        body = json.dumps({"model": MODEL, "prompt": list(range(1, 40)), "max_tokens": 2})
        status, data = harness.get("/v1/completions", body.encode())
        assert status == 200, data
        assert frozen.calls == service.pool.timeouts == 1
    finally:
        service.pool._store = None
        frozen.thaw()
