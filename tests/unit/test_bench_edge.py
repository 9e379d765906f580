"""``bench edge`` runs the real checks it times and prints its JSON (figures not asserted)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from kvserve.bench import edge
from kvserve.cli import build_parser
from router.api.edge import HostCheckMiddleware, served_hosts
from tests.bench_schemas import argv, mismatch


def test_bench_edge_times_the_checks_against_a_bare_app(capsys: pytest.CaptureFixture[str]) -> None:
    args = build_parser().parse_args(argv("edge", Path(), Path()))  # --requests 200 --repeat 1
    assert edge.run(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["bench"] == "edge" and out["conditions"]["requests"] == 200
    assert [r["what"] for r in out["results"]] == [
        "ASGI app that does nothing (baseline)",
        "the same behind HostCheckMiddleware",
        "require_json",
        "worker: a bearer token's check (the router's old form; baseline)",
        "worker: a router token's check, seen before",
        "worker: a router token's check, first sight (Ed25519)",
        "router: one call's token header",
        "router: minting a token (Ed25519)",
    ]
    bare, host, body = (r["us_per_request"] for r in out["results"][:3])
    assert min(r["us_per_request"] for r in out["results"]) > 0  # each one a time measured
    # the headline is what the checks add: a difference of two times, negative when the
    # machine was busier for the bare app (seen once in CI with --repeat 1), so its sign is
    # no check; how it is derived from the rows is
    assert out["headline"]["value"] == pytest.approx(host - bare + body, abs=0.002)
    assert mismatch("edge", out) is None  # the settings are the pinned ones


def test_the_scope_it_times_passes_the_check() -> None:
    """The timed request is one the router serves (a refused one would time the 400)."""
    sent: list[int] = []

    async def app(scope: object, receive: object, send: object) -> None:
        sent.append(200)

    async def never(*_: Any) -> Any:
        raise AssertionError("the check answered instead of the app")

    checked = HostCheckMiddleware(app, served_hosts("127.0.0.1", ""))
    asyncio.run(checked(edge.SCOPE, never, never))
    assert sent == [200]
