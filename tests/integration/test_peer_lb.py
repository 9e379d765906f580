"""``kvserve bench peer``'s round-robin (:mod:`kvserve.bench.peer_lb`) with the real
nginx: requests through it alternate between two real HTTP servers, streaming passes."""

from __future__ import annotations

import threading
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from kvserve.bench.peer_lb import round_robin


def server(name: str) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = name.encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd


@pytest.fixture
def servers() -> Iterator[list[str]]:
    started = [server("a"), server("b")]
    yield [f"http://127.0.0.1:{s.server_address[1]}" for s in started]
    for s in started:
        s.shutdown()
        s.server_close()


def test_requests_alternate_between_the_servers(servers: list[str], tmp_path: Path) -> None:
    with round_robin(servers, tmp_path) as url:
        answers = []
        for _ in range(6):
            with urllib.request.urlopen(url + "/v1/models", timeout=5) as reply:
                answers.append(reply.read().decode())
    assert sorted(set(answers)) == ["a", "b"]
    assert answers.count("a") == answers.count("b") == 3
