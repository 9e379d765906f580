"""``kvserve bench edge``: what the HTTP edge's checks against web pages cost per request.

In one process, each the median of ``--repeat`` runs of ``--requests`` calls: the router's
:class:`router.edge.HostCheckMiddleware` around an ASGI app that does nothing, against that
app alone (the baseline, same run), with the headers the official OpenAI client sends; and
:func:`router.edge.require_json` on its ``Content-Type``. Both run once per HTTP request,
on the router's event loop, before any route; a bare API key's own tenant is computed once
at start-up and costs a request nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any, ClassVar

from kvserve.report import emit, median
from kvserve.settings import BENCH_ENV, add_config_args
from router.edge import HostCheckMiddleware, require_json, served_hosts

SCOPE: dict[str, Any] = {
    "type": "http",
    "path": "/v1/completions",
    "headers": [
        (b"host", b"127.0.0.1:8000"),
        (b"accept-encoding", b"gzip, deflate"),
        (b"connection", b"keep-alive"),
        (b"accept", b"application/json"),
        (b"content-type", b"application/json"),
        (b"user-agent", b"OpenAI/Python 2.0"),
        (b"authorization", b"Bearer sk-example"),
        (b"content-length", b"512"),
    ],
}
"""A completion request's scope, with the headers the official OpenAI client sends."""

App = Callable[[MutableMapping[str, Any], Any, Any], Awaitable[None]]


@dataclass(frozen=True)
class EdgeBenchConfig:
    """What ``kvserve bench edge`` times.

    - ``requests``: calls of each check per run;
    - ``repeat``: runs per measurement (the median is reported).
    """

    env_prefix: ClassVar[str] = BENCH_ENV
    requests: int = 100_000
    repeat: int = 5


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of ``kvserve bench edge``."""
    add_config_args(p, EdgeBenchConfig)


async def _nothing(scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
    return None


async def _us_per_call(app: App, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        await app(SCOPE, None, None)
    return (time.perf_counter() - start) / n * 1e6


def _require_json_us(n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        require_json("application/json")
    return (time.perf_counter() - start) / n * 1e6


def run(args: argparse.Namespace) -> int:
    checked = HostCheckMiddleware(_nothing, served_hosts("127.0.0.1", ""))
    bare, host, body = [], [], []
    for _ in range(args.repeat):
        bare.append(asyncio.run(_us_per_call(_nothing, args.requests)))
        host.append(asyncio.run(_us_per_call(checked, args.requests)))
        body.append(_require_json_us(args.requests))
    timed = (
        ("ASGI app that does nothing (baseline)", bare),
        ("the same behind HostCheckMiddleware", host),
        ("require_json", body),
    )
    rows = [{"what": what, "us_per_request": round(median(us), 3)} for what, us in timed]
    added = median(host) - median(bare) + median(body)
    emit(
        "edge",
        {
            "requests": args.requests,
            "repeat": args.repeat,
            "statistic": "median wall time",
            "headers": len(SCOPE["headers"]),
        },
        rows,
        {
            "metric": "microseconds the Host and Content-Type checks add to one HTTP request",
            "value": round(added, 3),
            "baseline_us": round(median(bare), 3),
        },
    )
    return 0
