"""``kvserve bench peer``'s round-robin (:func:`kvserve.bench.peer.launch.round_robin`) with
the real nginx: requests through it alternate between two real HTTP servers, streaming
passes."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvserve.bench.peer.launch import round_robin
from tests.http_stub import text_server


@pytest.fixture
def servers() -> Iterator[list[str]]:
    started = [text_server(b"a"), text_server(b"b")]
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
