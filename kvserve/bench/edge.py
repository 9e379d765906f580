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
from kvserve.settings import BENCH_ENV, add_config_args
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


def _us(call: Callable[[], object], n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        call()
    return (time.perf_counter() - start) / n * 1e6


def _grpc_rows(n: int) -> dict[str, float]:
    """One run of the gRPC token checks (module docstring): microseconds per call each."""
    secret, audience, method = new_secret(), "10.0.0.5:50061", "/kvserve.worker.v1.Worker/Prefill"
    worker = Credentials.of(grant(secret, "worker"))
    router = Credentials.of(grant(secret, "router"))
    auth = Authenticator(worker, lambda: audience)
    signed, bearer = [header(router, ROUTER, audience)()], [header(worker, MONITOR, audience)()]
    seed, public = router.key(ROUTER_SIGN), worker.verifier(ROUTER) or b""
    fresh = Signer(seed, ROUTER).token(audience)
    few = max(1, n // 100)
    return {
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
    checked = HostCheckMiddleware(_nothing, served_hosts("127.0.0.1", ""))
    bare, host, body = [], [], []
    grpc_runs: list[dict[str, float]] = []
    for _ in range(args.repeat):
        bare.append(asyncio.run(_us_per_call(_nothing, args.requests)))
        host.append(asyncio.run(_us_per_call(checked, args.requests)))
        body.append(_us(lambda: require_json("application/json"), args.requests))
        grpc_runs.append(_grpc_rows(args.requests))
    timed = [
        ("ASGI app that does nothing (baseline)", bare),
        ("the same behind HostCheckMiddleware", host),
        ("require_json", body),
        *((what, [r[what] for r in grpc_runs]) for what in grpc_runs[0]),
    ]
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
