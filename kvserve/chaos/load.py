"""The load side of ``kvserve chaos``: a seeded greedy workload, its fault-free reference,
and running it against a router while recording how each request ended.

1. :func:`workload` draws requests (prompts sharing a few prefixes, so the pool serves
   prefix hits; a few output lengths; half of them streamed), all greedy with EOS ignored;
2. :func:`reference_texts` runs the same prompts on an in-process engine, fault-free;
3. :func:`run_load` sends them with ``concurrency`` clients (the official ``openai``
   client) and returns one :class:`Outcome` per request: ``ok`` (with its text),
   ``error`` (the server answered with a clear error: an HTTP status or an error event,
   or the connection broke), or ``hung`` (no answer within ``hang_s``), with the router
   that served it where a balancer says so (its ``X-Kvserve-Upstream``: the last address
   tried), so a request cut by a router's death can be told apart
   (:func:`kvserve.chaos.report.summarize`).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import openai

from workers.config import EngineConfig
from workers.core.sequence import SamplingParams

OUTPUT_LENGTHS = (16, 32, 64)


@dataclass(frozen=True)
class ChaosRequest:
    prompt: tuple[int, ...]
    max_tokens: int
    stream: bool


@dataclass(frozen=True)
class Outcome:
    """``status``: ``ok``, ``error`` or ``hung``; ``detail``: the error's text;
    ``ended``: when it ended (``time.monotonic()``); ``upstream``: the router's
    ``host:port`` behind a balancer ('' without one, or when none answered)."""

    status: str
    text: str = ""
    detail: str = ""
    seconds: float = 0.0
    response_id: str = ""
    ended: float = field(default_factory=time.monotonic)
    upstream: str = ""


def workload(count: int, seed: int, vocab: int, prefixes: int = 8) -> list[ChaosRequest]:
    """``count`` requests: one of ``prefixes`` shared 64-token prefixes, then 8-80 tokens
    of its own; output lengths from :data:`OUTPUT_LENGTHS`; every other one streamed."""
    rng = random.Random(seed)
    heads = [[rng.randrange(100, vocab) for _ in range(64)] for _ in range(prefixes)]
    out: list[ChaosRequest] = []
    for i in range(count):
        tail = [rng.randrange(100, vocab) for _ in range(rng.randint(8, 80))]
        prompt = tuple(rng.choice(heads) + tail)
        out.append(ChaosRequest(prompt, rng.choice(OUTPUT_LENGTHS), stream=i % 2 == 1))
    return out


def reference_texts(config: EngineConfig, requests: list[ChaosRequest]) -> list[str]:
    """Each request's greedy text from an in-process engine with no faults."""
    from workers.engine.engine import Engine

    engine = Engine(config)
    params = [
        SamplingParams(max_tokens=r.max_tokens, temperature=0, ignore_eos=True) for r in requests
    ]
    outs = engine.generate([list(r.prompt) for r in requests], params)
    return [o.text or "" for o in outs]


UPSTREAM = "x-kvserve-upstream"
"""The balancer's header naming the routers it tried (:mod:`kvserve.cluster.balancer`)."""


def upstream_of(headers: Mapping[str, str]) -> str:
    """The last router the balancer tried (the one that answered), or ''."""
    return headers.get(UPSTREAM, "").rsplit(",", 1)[-1].strip()


def _send(
    client: openai.OpenAI, model: str, req: ChaosRequest, upstream: list[str]
) -> tuple[str, str]:
    """The text and the response id (``cmpl-<the router's request id>``); the router that
    answered is appended to ``upstream`` as soon as its headers came."""
    kwargs = {
        "model": model,
        "prompt": list(req.prompt),
        "max_tokens": req.max_tokens,
        "temperature": 0,
        "extra_body": {"ignore_eos": True},
    }
    raw = client.completions.with_raw_response
    if not req.stream:
        reply = raw.create(**kwargs)  # type: ignore[call-overload]
        upstream.append(upstream_of(reply.headers))
        out = reply.parse()
        return out.choices[0].text, out.id
    parts: list[str] = []
    rid = ""
    reply = raw.create(stream=True, **kwargs)  # type: ignore[call-overload]
    upstream.append(upstream_of(reply.headers))
    for chunk in reply.parse():
        rid = chunk.id
        parts.extend(c.text for c in chunk.choices)
    return "".join(parts), rid


def send_one(client: openai.OpenAI, model: str, req: ChaosRequest) -> Outcome:
    """One request, classified (see the module docstring)."""
    t0 = time.monotonic()
    upstream: list[str] = []
    try:
        text, rid = _send(client, model, req, upstream)
    except openai.APITimeoutError:
        return Outcome("hung", seconds=time.monotonic() - t0, upstream="".join(upstream))
    except openai.APIStatusError as exc:
        detail = f"HTTP {exc.status_code}: {exc.message[:160]}"
        took = time.monotonic() - t0
        return Outcome(
            "error", detail=detail, seconds=took, upstream=upstream_of(exc.response.headers)
        )
    except openai.APIError as exc:  # an error event in a stream, or the connection broke
        took = time.monotonic() - t0
        return Outcome("error", detail=type(exc).__name__, seconds=took, upstream="".join(upstream))
    took = time.monotonic() - t0
    return Outcome("ok", text=text, seconds=took, response_id=rid, upstream="".join(upstream))


def run_load(
    base_url: str,
    model: str,
    requests: list[ChaosRequest],
    concurrency: int,
    hang_s: float,
    deadline: float,
    on_done: Callable[[int], None] | None = None,
    interval_s: float = 0.0,
) -> list[Outcome | None]:
    """Send every request (``concurrency`` at a time, request ``i`` not before
    ``i * interval_s`` seconds from now) until ``deadline`` (monotonic); a request not sent
    before it is ``None``."""
    client = openai.OpenAI(base_url=base_url, api_key="chaos", max_retries=0, timeout=hang_s)
    outcomes: list[Outcome | None] = [None] * len(requests)
    lock = threading.Lock()
    done = [0]
    start = time.monotonic()

    def one(i: int) -> None:
        if (wait := start + i * interval_s - time.monotonic()) > 0:
            time.sleep(wait)
        if time.monotonic() > deadline:
            return
        outcomes[i] = send_one(client, model, requests[i])
        with lock:
            done[0] += 1
            if on_done is not None:
                on_done(done[0])

    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(one, range(len(requests))))
    return outcomes
