"""An async load generator for any OpenAI-compatible server (ours, vLLM, ...), over aiohttp.

:func:`run_load`, for one list of :class:`RequestSpec`:

1. warm-up requests, if any, are sent one at a time and not recorded;
2. the clock starts (``t = 0``); each request waits until its ``arrival_s``, then for a slot
   under the concurrency cap (0: no cap), then is sent (``start_s``) as a streaming
   ``POST /v1/completions`` with the prompt as token ids (or text, through ``options.text``),
   ``max_tokens``, ``temperature 0``, ``ignore_eos`` (vLLM honours it; servers that don't
   know it ignore it) and ``stream_options.include_usage``;
3. the raw server-sent events are read line by line: each ``data:`` event with non-empty
   ``choices`` is a chunk (its arrival time is recorded, and its ``token_ids`` when the
   server sends them, :class:`StreamState`), the usage event gives prompt,
   completion and cached tokens, ``[DONE]`` ends the stream, an ``error`` event fails it;
4. an HTTP status other than 200, a timeout (``options.timeout_s`` per request) or a
   connection error becomes the record's ``error`` (and ``status_code``): a failed request
   never stops the run.

:func:`sending` gives the pieces of steps 1-2 (a :class:`Sender`) to drivers of other shapes
(:mod:`.conversation_client`). The server's counters are :mod:`.counters`'.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from kvserve.loadgen.metrics import RequestRecord
from kvserve.loadgen.workloads import RequestSpec


@dataclass(frozen=True)
class ClientOptions:
    """How each request is sent (``text``: prompt ids -> text, for ``--prompt-format text``)."""

    timeout_s: float = 600.0
    ignore_eos: bool = True
    text: Callable[[Sequence[int]], str] | None = None
    extra_body: dict[str, Any] = field(default_factory=dict)


def request_body(model: str, spec: RequestSpec, options: ClientOptions) -> dict[str, Any]:
    """The completion request of ``spec``: its prompt ids (as text through ``options.text``),
    then ``options.extra_body``."""
    ids = list(spec.prompt_token_ids)
    return {
        "model": model,
        "prompt": options.text(ids) if options.text else ids,
        "max_tokens": spec.max_tokens,
        "temperature": 0.0,
        "ignore_eos": options.ignore_eos,
        "stream": True,
        "stream_options": {"include_usage": True},
        **options.extra_body,
    }


@dataclass
class StreamState:
    """What the events of one stream said so far: chunk arrival times, the answer's token
    ids (vLLM's ``return_token_ids``: every chunk's ``token_ids``, concatenated; None while
    no chunk had the field), usage, error."""

    chunks: list[float] = field(default_factory=list)
    token_ids: list[int] | None = None
    usage: dict[str, Any] | None = None
    error: str | None = None

    def feed(self, line: bytes, now: float) -> bool:
        """Take one SSE line; False once the stream is over (``[DONE]`` or an error).
        ValueError for an event that is not JSON or has malformed ``token_ids``."""
        line = line.strip()
        if not line.startswith(b"data:"):
            return True
        payload = line[5:].strip()
        if payload == b"[DONE]":
            return False
        event = json.loads(payload)
        if event.get("error"):
            self.error = f"stream error: {event['error']}"
            return False
        if event.get("choices"):
            self.chunks.append(now)
            if (ids := event["choices"][0].get("token_ids")) is not None:
                if not isinstance(ids, list) or not all(type(t) is int for t in ids):
                    raise ValueError(f"token_ids must be a list of token ids, got {ids!r:.80}")
                self.token_ids = self.token_ids or []
                self.token_ids.extend(ids)
        if event.get("usage"):
            self.usage = event["usage"]
        return True


def to_record(
    spec: RequestSpec, start: float, end: float, state: StreamState, status: int | None
) -> RequestRecord:
    usage = state.usage or {}
    details = usage.get("prompt_tokens_details") or {}
    error = state.error or (None if state.chunks else "no tokens streamed")
    return RequestRecord(
        index=spec.index,
        arrival_s=spec.arrival_s,
        prompt_len=spec.prompt_len,
        max_tokens=spec.max_tokens,
        group=spec.group,
        start_s=start,
        end_s=end,
        chunk_times_s=tuple(state.chunks),
        output_tokens=int(usage.get("completion_tokens") or len(state.chunks)),
        prompt_tokens=usage.get("prompt_tokens"),
        cached_tokens=details.get("cached_tokens"),
        error=error,
        status_code=status,
        conversation=spec.conversation,
        turn=spec.turn,
    )


async def send(
    session: aiohttp.ClientSession,
    url: str,
    body: dict[str, Any],
    spec: RequestSpec,
    clock: Callable[[], float],
    timeout_s: float,
) -> tuple[RequestRecord, StreamState]:
    """One streamed request: its record and what its stream said (the answer's ids); every
    failure becomes the record's ``error``."""
    start, state, status = clock(), StreamState(), None
    try:
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        async with session.post(url, json=body, timeout=timeout) as resp:
            status = resp.status
            if status != 200:
                state.error = f"HTTP {status}: {(await resp.text())[:300]}"
            else:
                async for line in resp.content:
                    if not state.feed(line, clock()):
                        break
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        state.error = f"{type(exc).__name__}: {exc}"[:300]
    return to_record(spec, start, clock(), state, status), state


def progress_bar(total: int, desc: str) -> tuple[Any, Callable[[], None]]:
    """A rich progress bar on stderr and its ``advance`` callable."""
    from rich.console import Console
    from rich.progress import Progress

    bar = Progress(console=Console(file=sys.stderr), transient=True)
    task = bar.add_task(desc or "requests", total=total)
    return bar, lambda: bar.advance(task)


@dataclass(frozen=True)
class Sender:
    """One run's session, URL, clock (seconds from ``t = 0``), concurrency slots and
    progress: :meth:`send` is how every recorded request of the run goes out."""

    session: aiohttp.ClientSession
    url: str
    model: str
    options: ClientOptions
    clock: Callable[[], float]
    slots: asyncio.Semaphore
    advance: Callable[[], None]

    async def send(self, spec: RequestSpec) -> tuple[RequestRecord, StreamState]:
        """``spec`` once a slot is free: its record and stream."""
        async with self.slots:
            body = request_body(self.model, spec, self.options)
            sent = await send(
                self.session, self.url, body, spec, self.clock, self.options.timeout_s
            )
        self.advance()
        return sent


@contextlib.asynccontextmanager
async def sending(
    base_url: str,
    model: str,
    total: int,
    concurrency: int = 0,
    *,
    options: ClientOptions | None = None,
    warmup: Sequence[RequestSpec] = (),
    progress: bool = True,
    desc: str = "",
) -> AsyncIterator[Sender]:
    """A :class:`Sender` for ``total`` requests: steps 1 and 2 of the module docstring (the
    warm-up, then the clock starts and at most ``concurrency`` requests are in flight)."""
    opts = options or ClientOptions()
    url = base_url.rstrip("/") + "/v1/completions"
    connector = aiohttp.TCPConnector(limit=concurrency if concurrency > 0 else 0)
    async with aiohttp.ClientSession(connector=connector) as session:
        for spec in warmup:
            body = request_body(model, spec, opts)
            await send(session, url, body, spec, time.perf_counter, opts.timeout_s)
        t0 = time.perf_counter()

        def clock() -> float:
            return time.perf_counter() - t0

        slots = asyncio.Semaphore(concurrency if concurrency > 0 else total or 1)
        bar, advance = progress_bar(total, desc)
        with bar if progress else contextlib.nullcontext():
            yield Sender(session, url, model, opts, clock, slots, advance)


async def run_load(
    base_url: str,
    model: str,
    requests: Sequence[RequestSpec],
    concurrency: int = 0,
    *,
    options: ClientOptions | None = None,
    warmup: Sequence[RequestSpec] = (),
    progress: bool = True,
    desc: str = "",
) -> list[RequestRecord]:
    """Send ``requests`` at their arrival times (module docstring); records in index order."""
    async with sending(
        base_url,
        model,
        len(requests),
        concurrency,
        options=options,
        warmup=warmup,
        progress=progress,
        desc=desc,
    ) as sender:

        async def launch(spec: RequestSpec) -> RequestRecord:
            await asyncio.sleep(max(0.0, spec.arrival_s - sender.clock()))
            record, _ = await sender.send(spec)
            return record

        records = await asyncio.gather(*(launch(s) for s in requests))
    return sorted(records, key=lambda r: r.index)


async def fetch_models(base_url: str, timeout_s: float = 30.0) -> list[str]:
    """The ids of ``GET /v1/models``."""
    async with (
        aiohttp.ClientSession() as session,
        session.get(
            base_url.rstrip("/") + "/v1/models", timeout=aiohttp.ClientTimeout(total=timeout_s)
        ) as resp,
    ):
        resp.raise_for_status()
        data = await resp.json()
    return [m["id"] for m in data.get("data", [])]
