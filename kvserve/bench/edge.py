"""``kvserve bench edge``: what the trust checks cost per HTTP request and per gRPC call.

In one process, each the median of ``--repeat`` runs of ``--requests`` calls:

- the router's :class:`router.api.edge.HostCheckMiddleware` around an ASGI app that does
  nothing, against that app alone (the baseline, same run), with the headers the official
  OpenAI client sends; and :func:`router.api.edge.require_json` on its ``Content-Type``. Both
  run once per HTTP request, on the router's event loop, before any route; a bare API key's
  own tenant is computed once at start-up and costs a request nothing;
- a worker's check of a call's token (:class:`proto.grpc_auth.Authenticator`): a router
  token it has seen before (every call but the first of each 10 s), against a bearer
  token's check (the ``monitor`` token: the form the router's token had before it was
  signed per worker; the baseline, same run); a router token seen for the first time (an
  Ed25519 verification); and the router's side: the header of one call, and minting a token
  (an Ed25519 signature, once per worker every 10 s; ``--requests`` / 100 of these two).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any, ClassVar

from kvserve.report import emit, median
from kvserve.settings import BENCH_ENV
from proto.call_tokens import Signer, Verifier
from proto.credentials import Credentials
from proto.grants import grant
from proto.grpc_auth import MONITOR, ROUTER, Authenticator, header
from proto.trust import ROUTER_SIGN, new_secret
from router.api.edge import HostCheckMiddleware, require_json, served_hosts

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


@dataclass(frozen=True)
class EdgeBenchConfig:
    """What ``kvserve bench edge`` times.

    - ``requests``: calls of each check per run;
    - ``repeat``: runs per measurement (the median is reported).
    """

    env_prefix: ClassVar[str] = BENCH_ENV
    requests: int = 100_000
    repeat: int = 5


SETTINGS = (EdgeBenchConfig,)


async def _nothing(scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
    return None


async def _us_per_request(app: Callable[..., Awaitable[None]], n: int) -> float:
    """Microseconds per request of the ASGI ``app``, ``n`` requests in a row."""
    start = time.perf_counter()
    for _ in range(n):
        await app(SCOPE, None, None)
    return (time.perf_counter() - start) / n * 1e6


def _us(call: Callable[[], object], n: int) -> float:
    """Microseconds per call of ``call``, ``n`` calls in a row."""
    start = time.perf_counter()
    for _ in range(n):
        call()
    return (time.perf_counter() - start) / n * 1e6


def _one_run(n: int) -> dict[str, float]:
    """One run of every check (module docstring), in the order of the rows: microseconds
    per call of each (``n`` calls; ``n`` / 100 of the Ed25519 ones)."""
    checked = HostCheckMiddleware(_nothing, served_hosts("127.0.0.1", ""))
    secret, audience, method = new_secret(), "10.0.0.5:50061", "/kvserve.worker.v1.Worker/Prefill"
    worker = Credentials.of(grant(secret, "worker"))
    router = Credentials.of(grant(secret, "router"))
    auth = Authenticator(worker, lambda: audience)
    signed, bearer = [header(router, ROUTER, audience)()], [header(worker, MONITOR, audience)()]
    seed, public = router.key(ROUTER_SIGN), worker.verifier(ROUTER) or b""
    fresh = Signer(seed, ROUTER).token(audience)
    few = max(1, n // 100)
    return {
        "ASGI app that does nothing (baseline)": asyncio.run(_us_per_request(_nothing, n)),
        "the same behind HostCheckMiddleware": asyncio.run(_us_per_request(checked, n)),
        "require_json": _us(lambda: require_json("application/json"), n),
        "worker: a bearer token's check (the router's old form; baseline)": _us(
            lambda: auth.refusal(method, bearer), n
        ),
        "worker: a router token's check, seen before": _us(lambda: auth.refusal(method, signed), n),
        "worker: a router token's check, first sight (Ed25519)": _us(
            lambda: Verifier(public, lambda: audience).why_not(fresh), few
        ),
        "router: one call's token header": _us(header(router, ROUTER, audience), n),
        "router: minting a token (Ed25519)": _us(lambda: Signer(seed, ROUTER).token(audience), few),
    }


def run(args: argparse.Namespace) -> int:
    runs = [_one_run(args.requests) for _ in range(args.repeat)]
    us = {what: median([run[what] for run in runs]) for what in runs[0]}
    bare, host, body = list(us.values())[:3]  # the HTTP checks
    emit(
        "edge",
        {
            "requests": args.requests,
            "repeat": args.repeat,
            "statistic": "median wall time",
            "headers": len(SCOPE["headers"]),
        },
        [{"what": what, "us_per_request": round(value, 3)} for what, value in us.items()],
        {
            "metric": "microseconds the Host and Content-Type checks add to one HTTP request",
            "value": round(host - bare + body, 3),
            "baseline_us": round(bare, 3),
        },
    )
    return 0
